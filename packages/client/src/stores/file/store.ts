import { randomBytes } from 'node:crypto'
import { mkdir, unlink } from 'node:fs/promises'
import type { IntentRecord } from '../../intent.js'
import type { ExclusiveResult, IntentStore, StoreEventSink, WriteOptions } from '../../store.js'
import { HeldClaim } from '../claim.js'
import { CellPool } from './cells.js'
import { closeChain, type OpenChain } from './chain-file.js'
import { fsError } from './fs.js'
import { listIntents } from './listing.js'
import { LockFiles } from './lock.js'
import { FileOwner } from './owner.js'
import { Placement } from './placement.js'
import { quarantine } from './quarantine.js'
import { SlotPool } from './slots.js'

// One intent this store drives right now: under its per-intent lock, or as the owner of an intent it created.
interface Section {
  claim: HeldClaim
  /** Driven as its creator and owner, without a per-intent lock. */
  owned: boolean
  file?: OpenChain
  deleted?: boolean
}

/**
 * The intent store of `fileStore` (see its documentation for the promises it keeps): the sections it drives (under
 * a per-intent lock, or as the owner of the intents it created) and the chain each of them appends to. Where a
 * chain goes is {@link Placement}'s; what listing finds is `listIntents`'.
 */
export class FileStore implements Required<IntentStore> {
  readonly #dir: string
  readonly #leaseMs: number
  readonly #locks: LockFiles
  readonly #owner: FileOwner
  readonly #slots: SlotPool
  readonly #cells: CellPool
  readonly #placement: Placement
  readonly #sections = new Map<string, Section>()
  #sink: StoreEventSink | undefined
  #ready: Promise<unknown> | undefined

  constructor(dir: string, leaseMs: number) {
    this.#dir = dir
    this.#leaseMs = leaseMs
    this.#locks = new LockFiles(leaseMs)
    this.#owner = new FileOwner(dir, this.#locks)
    this.#slots = new SlotPool(dir, this.#owner.token)
    this.#cells = new CellPool(dir, this.#owner.token)
    this.#placement = new Placement(dir, this.#owner.token, this.#slots, this.#cells, (path, reason) =>
      quarantine(dir, path, reason, this.#sink),
    )
  }

  attach(sink: StoreEventSink): void {
    this.#sink = sink
  }

  async get(id: string): Promise<IntentRecord | undefined> {
    await this.#ensureDir()
    const found = await this.#placement.find(id)
    const section = this.#sections.get(id)
    if (section && found && found.chain.digest !== section.file?.chain.digest) {
      // The section appends to the chain it read last.
      await closeChain(section.file)
      section.file = found
    }
    return found?.chain.record
  }

  async set(record: IntentRecord, options?: WriteOptions): Promise<void> {
    await this.#ensureDir()
    const section = this.#sections.get(record.id)
    if (options?.durable === false) return this.#append(record, section)
    const previous = section?.file ?? (await this.#placement.find(record.id))
    const written = await this.#placement.rewrite(record, previous, this.#ownerOf(section))
    if (!section) return closeChain(written)
    await closeChain(section.file)
    section.file = written
    section.deleted = false
  }

  async delete(id: string, options?: WriteOptions): Promise<void> {
    await this.#ensureDir()
    const durable = options?.durable !== false
    const section = this.#sections.get(id)
    // An intent created by another store that this one has not listed yet is found by listing.
    const file =
      section?.file ??
      (await this.#placement.find(id)) ??
      (durable ? await this.list().then(() => this.#placement.find(id)) : undefined)
    if (section) section.deleted = true
    if (section && file?.place.cell === undefined) {
      await closeChain(section.file)
      section.file = undefined
    }
    await this.#placement.remove(id, file, durable)
  }

  async list(): Promise<IntentRecord[]> {
    await this.#ensureDir()
    return listIntents({
      dir: this.#dir,
      leaseMs: this.#leaseMs,
      locks: this.#locks,
      owner: this.#owner,
      placement: this.#placement,
    })
  }

  async exclusive<T>(id: string, fn: () => Promise<T>): Promise<ExclusiveResult<T>> {
    await this.#ensureDir()
    const lock = this.#placement.lockOf(id)
    const locks = this.#locks
    // The token tells this claim's lock file from any other's, this process's included.
    const token = randomBytes(8).toString('hex')
    const since = Date.now()
    if (!(await locks.take(lock, () => locks.text(since + this.#leaseMs, token)))) return { acquired: false }
    // An intent whose creator still runs and drives it, here or in another process, is not taken from it.
    if (this.#sections.has(id) || (await this.#ownedByAnother(id).catch(() => false))) {
      await unlink(lock).catch(() => {})
      return { acquired: false }
    }
    const claim = new HeldClaim('file', id, () => this.#sink)
    claim.lease(this.#leaseMs, since, (until) => locks.renew(lock, token, () => locks.text(until, token)))
    const section: Section = { claim, owned: false }
    this.#sections.set(id, section)
    const value = await claim.run(fn, async () => {
      await this.#endSection(id, section)
      // A lost claim's lock file is left alone: it may be another process's by now.
      if (!claim.lost) await unlink(lock).catch(() => {})
    })
    return { acquired: true, value }
  }

  async create<T>(record: IntentRecord, fn: () => Promise<T>): Promise<T> {
    await this.#ensureDir()
    this.#cells.prepare()
    await this.#owner.ready().catch((error: unknown) => {
      throw fsError(error)
    })
    const id = record.id
    const claim = new HeldClaim('file', id, () => this.#sink)
    const section: Section = { claim, owned: true }
    this.#sections.set(id, section)
    this.#owner.sections.set(id, claim)
    try {
      section.file = await this.#placement.toCell(record)
    } catch (error) {
      this.#sections.delete(id)
      this.#owner.sections.delete(id)
      throw error
    }
    return claim.run(fn, async () => {
      this.#owner.sections.delete(id)
      await this.#endSection(id, section)
    })
  }

  async close(): Promise<void> {
    await this.#cells.close()
    await this.#slots.close()
    await this.#owner.close()
  }

  #ensureDir(): Promise<unknown> {
    this.#ready ??= mkdir(this.#dir, { recursive: true }).catch((error) => {
      this.#ready = undefined
      throw fsError(error)
    })
    return this.#ready
  }

  // The owner token a section's versions name: this store's while it drives an intent it created, else none.
  #ownerOf(section: Section | undefined): string | null {
    return section?.owned ? this.#owner.token : null
  }

  // Appends a later version of `record` to its chain, without a flush. A record that is gone (deleted or discarded
  // meanwhile) stays gone.
  async #append(record: IntentRecord, section: Section | undefined): Promise<void> {
    if (section?.deleted) return
    const current = section?.file ?? (await this.#placement.find(record.id))
    if (!current) return
    let now: OpenChain | undefined
    try {
      now = await this.#placement.append(record, current, this.#ownerOf(section))
    } finally {
      if (!section) await closeChain(current)
    }
    if (!section && now !== current) await closeChain(now)
    else if (section && now) section.file = now
  }

  // Whether a store other than this one created intent `id`, still runs, and has not let go of it.
  async #ownedByAnother(id: string): Promise<boolean> {
    const token = (await this.#placement.find(id))?.chain.owner ?? null
    return token !== null && token !== this.#owner.token && (await this.#owner.alive(token))
  }

  // Ends a section: lets go of an intent this store created and that is still pending (a version naming no owner,
  // so any process may drive it under its lock from now on).
  async #endSection(id: string, section: Section): Promise<void> {
    this.#sections.delete(id)
    try {
      if (!section.deleted && section.owned && section.file?.chain.owner === this.#owner.token) {
        await this.#append(section.file.chain.record, { ...section, owned: false })
      }
    } catch {
      // Best effort: an intent not let go of is this store's to drive until it closes or exits, then any process's.
    }
    await closeChain(section.file)
  }
}
