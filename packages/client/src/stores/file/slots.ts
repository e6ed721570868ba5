import { type FileHandle, open, unlink } from 'node:fs/promises'
import { join } from 'node:path'
import { fsError, syncDir, writeAll } from './fs.js'

/** A file ready to take a write-ahead record: allocated, zero-filled and flushed, its name flushed too. */
export interface Slot {
  path: string
  handle: FileHandle
}

/** Bytes allocated in a new slot: a write-ahead record that fits overwrites data in place and changes no metadata. */
export const SLOT_BYTES = 16 * 1024
// Slots created at once when the pool runs low (their creation costs one flush each and one for the directory,
// off the path of any mutation).
const BATCH = 4
const LOW = 2

/**
 * One store's free slots, named `<owner>.<n>.slot` in the store's directory, for records that get a file of their
 * own (intents with an `intentId`, and records too large for a cell). A write-ahead takes one, writes the record
 * over its start, flushes it with one fdatasync and renames it to the intent's name. New slots are created in the
 * background when few are left.
 */
export class SlotPool {
  readonly #free: Slot[] = []
  #filling: Promise<void> | undefined
  #count = 0

  constructor(
    readonly dir: string,
    readonly owner: string,
  ) {}

  /** Whether `name` (a file name in the directory) is a slot of the store `owner`, and of which owner. */
  static ownerOf(name: string): string | undefined {
    const match = /^([0-9a-f]{16})\.\d+\.slot$/.exec(name)
    return match?.[1]
  }

  /** A free slot; creates some first when none is left (a full disk rejects with `QuotaExceededError`). */
  async take(): Promise<Slot> {
    for (;;) {
      const slot = this.#free.pop()
      if (slot) {
        if (this.#free.length < LOW) this.#fill().catch(() => {}) // the next take() retries and reports
        return slot
      }
      await this.#fill()
    }
  }

  /** Starts creating slots in the background when few are left, so the next write-ahead finds one. */
  prepare(): void {
    if (this.#free.length < LOW) this.#fill().catch(() => {})
  }

  /** Removes the free slots. */
  async close(): Promise<void> {
    await this.#filling?.catch(() => {})
    for (const slot of this.#free.splice(0)) {
      await slot.handle.close().catch(() => {})
      await unlink(slot.path).catch(() => {})
    }
  }

  #fill(): Promise<void> {
    this.#filling ??= (async () => {
      const created: Slot[] = []
      try {
        for (let i = 0; i < BATCH; i++) created.push(await this.#create())
        await syncDir(this.dir)
      } catch (error) {
        for (const slot of created) {
          await slot.handle.close().catch(() => {})
          await unlink(slot.path).catch(() => {})
        }
        throw fsError(error)
      }
      this.#free.unshift(...created)
    })().finally(() => {
      this.#filling = undefined
    })
    return this.#filling
  }

  async #create(): Promise<Slot> {
    const path = join(this.dir, `${this.owner}.${this.#count++}.slot`)
    const handle = await open(path, 'wx+')
    try {
      await writeAll(handle, Buffer.alloc(SLOT_BYTES), 0)
      await handle.sync()
      return { path, handle }
    } catch (error) {
      await handle.close().catch(() => {})
      await unlink(path).catch(() => {})
      throw error
    }
  }
}
