import { createHash } from 'node:crypto'
import { open, rename, unlink } from 'node:fs/promises'
import { join } from 'node:path'
import type { IntentRecord } from '../../intent.js'
import { CELL_BYTES, type CellPool } from './cells.js'
import { appendFrame, emptyChain, type OpenChain, type Place, readChain, writeDurably } from './chain-file.js'
import { fsError, removeIfPresent, syncDir } from './fs.js'
import { firstFrame, nextFrame } from './records.js'
import type { SlotPool } from './slots.js'

/**
 * Which file, or which cell of a cells file, holds each intent's chain, and moving a chain between them.
 *
 * A new intent's write-ahead record goes into a cell of this store (see {@link CellPool}); an intent with an
 * `intentId`, a durable rewrite, and a chain that outgrew its cell get a file of their own, named after a hash of
 * the intent's id so that any process finds it, made from a prepared slot (see {@link SlotPool}). The cells of the
 * intents this store created or found by listing are remembered here: a cell is found by no name.
 */
export class Placement {
  // The cells of intents this store created or found by listing; a cell may have been emptied since.
  readonly #cellOf = new Map<string, Place>()

  constructor(
    readonly dir: string,
    /** The owner token of this store, written into what it empties. */
    readonly token: string,
    readonly slots: SlotPool,
    readonly cells: CellPool,
    /** Called with a file of its own that holds no readable chain. */
    readonly quarantine: (path: string, reason: string) => Promise<void>,
  ) {}

  /** Ids can hold any character; a hash makes a safe, fixed-length file name. */
  nameOf(id: string): string {
    return createHash('sha256').update(id).digest('hex').slice(0, 40)
  }

  /** The file of its own of intent `id`. */
  fileOf(id: string): string {
    return join(this.dir, `${this.nameOf(id)}.json`)
  }

  /** The lock file of intent `id`. */
  lockOf(id: string): string {
    return join(this.dir, `${this.nameOf(id)}.lock`)
  }

  /** Remembers that intent `id` is in the cell at `place` (found by listing). */
  remember(id: string, place: Place): void {
    this.#cellOf.set(id, place)
  }

  /**
   * Intent `id`: from its own file (quarantined when corrupt), else from the cell this store knows for it (a file
   * there holding another intent, after a power loss undid renames, is left for listing to put in its place).
   */
  async find(id: string): Promise<OpenChain | undefined> {
    const path = this.fileOf(id)
    const content = await readChain({ path })
    if (content?.kind === 'chain' && content.chain.record.id === id)
      return { place: { path }, chain: content.chain }
    if (content?.kind === 'corrupt') await this.quarantine(path, content.reason)
    const place = this.#cellOf.get(id)
    const inCell = place && (await readChain(place))
    if (place && inCell?.kind === 'chain' && inCell.chain.record.id === id)
      return { place, chain: inCell.chain }
    return undefined
  }

  /**
   * Writes `record` as a new chain into a slot, flushes it, and renames the slot to the intent's file (replacing
   * what was there). A failure empties and removes the slot before rejecting: a write-ahead reported as failed
   * never comes back.
   */
  async toFile(record: IntentRecord, owner: string | null): Promise<OpenChain> {
    const { bytes, chain } = firstFrame(record, owner)
    const slot = await this.slots.take()
    try {
      await writeDurably(slot.handle, bytes, 0)
      const path = this.fileOf(record.id)
      await rename(slot.path, path)
      return { place: { path }, chain, handle: slot.handle }
    } catch (error) {
      try {
        await emptyChain(slot.handle, this.token, bytes.length, 0, false)
      } catch {}
      await slot.handle.close().catch(() => {})
      await unlink(slot.path).catch(() => {})
      throw fsError(error)
    }
  }

  /**
   * Writes a new intent's record, owned by this store, into a cell and flushes it (a record too large for a cell
   * gets a file instead). A failure empties the cell before rejecting.
   */
  async toCell(record: IntentRecord): Promise<OpenChain> {
    const { bytes, chain } = firstFrame(record, this.token)
    if (bytes.length > CELL_BYTES) return this.toFile(record, this.token)
    const cell = await this.cells.take()
    try {
      await writeDurably(cell.handle, bytes, cell.offset)
    } catch (error) {
      try {
        await emptyChain(cell.handle, this.token, bytes.length, cell.offset, true)
      } catch {}
      await this.cells.emptied(cell.path)
      throw fsError(error)
    }
    const place = { path: cell.path, cell: cell.offset }
    this.#cellOf.set(record.id, place)
    return { place, chain, handle: cell.handle, shared: true }
  }

  /**
   * Appends a later version of `record` to `current`, its chain, without a flush, and returns where its chain is
   * now: `current`, or undefined when its file is gone (the intent stays gone). A version that no longer fits its
   * cell moves the intent to a file of its own (a durable write, then the cell is emptied).
   */
  async append(
    record: IntentRecord,
    current: OpenChain,
    owner: string | null,
  ): Promise<OpenChain | undefined> {
    const next = nextFrame(current.chain, record, owner)
    if (current.place.cell === undefined || next.chain.end <= CELL_BYTES) {
      return (await appendFrame(current, next)) ? current : undefined
    }
    const moved = await this.toFile(record, owner)
    this.#cellOf.delete(record.id)
    await this.emptyCell(current, false)
    return moved
  }

  /**
   * Writes `record` durably as a new chain in a file of its own: the chain that was in a cell (`previous`) no
   * longer holds the intent and is emptied.
   */
  async rewrite(
    record: IntentRecord,
    previous: OpenChain | undefined,
    owner: string | null,
  ): Promise<OpenChain> {
    const written = await this.toFile(record, owner)
    if (previous?.place.cell !== undefined) await this.emptyCell(previous, false).catch(() => {})
    this.#cellOf.delete(record.id)
    return written
  }

  /**
   * Removes intent `id` from `file`, where it is: a cell is emptied in place (zeros over its whole chain, so no
   * byte of the record stays on disk, and it is never used again), a file of its own is removed. Flushed when
   * `durable`.
   */
  async remove(id: string, file: Omit<OpenChain, 'chain'> | undefined, durable: boolean): Promise<void> {
    if (file?.place.cell !== undefined) {
      this.#cellOf.delete(id)
      return this.emptyCell(file, durable)
    }
    await removeIfPresent(this.fileOf(id))
    if (durable) await syncDir(this.dir)
  }

  // Empties a cell (see remove) and counts it as emptied for its cells file.
  async emptyCell(
    file: Omit<OpenChain, 'chain'> & { chain?: OpenChain['chain'] },
    durable: boolean,
  ): Promise<void> {
    const handle = file.handle ?? (await open(file.place.path, 'r+').catch(() => undefined))
    if (!handle) return
    try {
      await emptyChain(handle, this.token, file.chain?.end, file.place.cell!, durable)
    } finally {
      if (!file.shared) await handle.close().catch(() => {})
    }
    await this.cells.emptied(file.place.path)
  }
}
