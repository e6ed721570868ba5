import { type FileHandle, open, unlink } from 'node:fs/promises'
import { join } from 'node:path'
import { fsError, syncDir, writeAll } from './fs.js'

/** Bytes of one cell: a new intent's write-ahead record and its later versions must fit (else they move out). */
export const CELL_BYTES = 16 * 1024
/** Cells in one cells file. */
export const CELLS = 16

/** Where an intent created by a store lives: one cell of one of its cells files. */
export interface Cell {
  path: string
  handle: FileHandle
  /** Byte offset of the cell in its file. */
  offset: number
}

// A cells file being handed out: its open handle, the next cell never used, and how many cells were emptied.
interface Batch {
  path: string
  handle: FileHandle
  next: number
  emptied: number
}

/**
 * A store's cells: files of {@link CELLS} cells of {@link CELL_BYTES} each, named `<owner>.<n>.cells`, created,
 * zero-filled and flushed (their names flushed too) ahead of time, off the path of any mutation. A new intent's
 * write-ahead record goes into the next cell never used, and is made durable by one fdatasync of a file whose
 * allocation and name are already durable: nothing but the new bytes is flushed, and no file is created or renamed.
 * A cell is never used twice, so any process may write into a cell it found (a driver appending versions, a
 * discard emptying it) without racing a new intent. A file whose every cell was used and emptied is removed.
 */
export class CellPool {
  #current: Batch | undefined
  #spare: Promise<Batch> | undefined
  #count = 0
  #closed = false
  readonly #batches = new Map<string, Batch>()

  constructor(
    readonly dir: string,
    readonly owner: string,
  ) {}

  /** The owner token of `name` when it is a cells file. */
  static ownerOf(name: string): string | undefined {
    return /^([0-9a-f]{16})\.\d+\.cells$/.exec(name)?.[1]
  }

  /** The next cell never used; waits for a new cells file when none is left (a full disk rejects). */
  async take(): Promise<Cell> {
    for (;;) {
      const batch = this.#current
      if (batch && batch.next < CELLS) {
        const cell = { path: batch.path, handle: batch.handle, offset: batch.next++ * CELL_BYTES }
        this.prepare()
        return cell
      }
      this.prepare()
      const spare = this.#spare!
      this.#current = await spare
      if (this.#spare === spare) this.#spare = undefined
    }
  }

  /** Counts a cell of this store as emptied; removes its file once every cell of it is used and emptied. */
  async emptied(path: string): Promise<void> {
    const batch = this.#batches.get(path)
    if (!batch || ++batch.emptied < CELLS) return
    this.#batches.delete(path)
    await batch.handle.close().catch(() => {})
    await unlink(path).catch(() => {})
  }

  /**
   * Starts creating the next cells file in the background when the current one is half used (or there is none),
   * unless one is ready or on its way.
   */
  prepare(): void {
    if (this.#spare || (this.#current && this.#current.next <= CELLS / 2)) return
    const spare = this.#create()
    this.#spare = spare
    spare.catch(() => {
      if (this.#spare === spare) this.#spare = undefined // the next take() or prepare() tries again
    })
  }

  /** Closes the handles; the files keep the cells of pending intents, and other stores remove the rest. */
  async close(): Promise<void> {
    this.#closed = true
    await this.#spare?.catch(() => {})
    for (const batch of this.#batches.values()) await batch.handle.close().catch(() => {})
    this.#batches.clear()
    this.#current = undefined
  }

  async #create(): Promise<Batch> {
    const path = join(this.dir, `${this.owner}.${this.#count++}.cells`)
    let handle: FileHandle
    try {
      handle = await open(path, 'wx+')
    } catch (error) {
      throw fsError(error)
    }
    try {
      await writeAll(handle, Buffer.alloc(CELLS * CELL_BYTES), 0)
      await handle.sync()
      await syncDir(this.dir)
    } catch (error) {
      await handle.close().catch(() => {})
      await unlink(path).catch(() => {})
      throw fsError(error)
    }
    const batch: Batch = { path, handle, next: 0, emptied: 0 }
    if (this.#closed) await handle.close()
    else this.#batches.set(path, batch)
    return batch
  }
}
