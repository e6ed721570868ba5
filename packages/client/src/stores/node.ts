import { createHash, randomBytes } from 'node:crypto'
import { type FileHandle, mkdir, open, readdir, readFile, rename, unlink } from 'node:fs/promises'
import { join } from 'node:path'
import { type IntentRecord, isIntentRecord } from '../intent.js'
import type { ExclusiveResult, IntentStore, StoreEventSink } from '../store.js'
import { OptionChecks } from '../validate.js'
import { HeldClaim } from './claim.js'
import { CELL_BYTES, CELLS, CellPool } from './file/cells.js'
import { errno, fsError, removeIfPresent, syncDir, writeAllSync as writeAt } from './file/fs.js'
import { LockFiles } from './file/lock.js'
import { FileOwner } from './file/owner.js'
import { type Chain, type Content, emptied, firstFrame, nextFrame, parse } from './file/records.js'
import { SlotPool } from './file/slots.js'

/** Options of {@link fileStore}. */
export interface FileStoreOptions {
  /**
   * Directory holding the intents (created if missing). Processes sharing it share their intents; it must be on a
   * local file system of this machine. Required.
   * @default none: required
   * @example '.oncely'
   */
  dir: string
  /**
   * How long a claim lasts without renewal: a process's claim on an intent it drives, and a store's claim on the
   * intents it created (its owner file). A claim whose process no longer runs is taken over at once; the holder
   * renews it every `leaseMs / 3`. When a renewal fails, the lease runs out before one succeeds, or another
   * process replaced the lock file, the claim is lost: the section driving the intent then rejects with
   * `StorageError` once it settles (its own error wins), with a `claim-lost` event as soon as the loss is noticed.
   * @default 10_000
   * @example 30_000
   */
  leaseMs?: number
}

const QUARANTINE = 'quarantine'

// Where an intent's chain of versions is: a file of its own named after the intent, or a cell of a cells file.
interface Place {
  path: string
  /** The cell's offset in its cells file; undefined for a file of its own. */
  cell?: number
}

// An intent's place, the chain it holds as last read or written, and an open handle once it was written.
interface Open {
  place: Place
  chain: Chain
  handle?: FileHandle
  /** The handle belongs to the cell pool (a cells file of this store): never closed here. */
  shared?: boolean
}

// One intent this store drives right now: under its per-intent lock, or as the owner of an intent it created.
interface Section {
  claim: HeldClaim
  /** Driven as its creator and owner, without a per-intent lock. */
  owned: boolean
  file?: Open
  deleted?: boolean
}

/**
 * Keeps intents as files for Node, which every process sharing `dir` reads.
 *
 * A new intent (a request without `intentId`) costs one flush before its first byte and nothing else: its
 * write-ahead record goes into a cell never used before, in a file whose space and name were flushed ahead of time,
 * and is made durable with one fdatasync. An intent with an `intentId` gets a file of its own named after a hash of
 * it (so any process finds it): the record goes over the start of a slot prepared the same way, is flushed with one
 * fdatasync, and the slot is renamed to that name. Later versions (attempt counters, outcomes) are appended after
 * the last one without a flush, each chained to the one before by a digest, so a torn, stale or foreign version is
 * never read: a crash of the process loses nothing that was written, and a power loss may only lose versions after
 * the write-ahead one, which `resume()` then resends with the same key for the server to replay. Deleting an intent
 * overwrites its chain with zeros in place (or removes its own file); `discard` also flushes that.
 *
 * A new intent is claimed by the store that creates it (see {@link FileOwner}), so it needs no lock before its
 * first byte; any other intent is driven under a lock file per intent. Unreadable intent files are moved to
 * `<dir>/quarantine/` with a `quarantined` event instead of crashing the client.
 *
 * @example
 * import { fileStore } from '@oncely/client/node'
 * createClient({ baseUrl, store: fileStore({ dir: '.oncely' }) })
 */
export function fileStore(options: FileStoreOptions): IntentStore {
  const checks = new OptionChecks('fileStore', options)
  if (typeof options.dir !== 'string' || options.dir === '') {
    checks.problem('Expected `dir` to be a non-empty directory path')
  }
  const leaseMs = checks.number('leaseMs', options.leaseMs, 10_000, Number.MIN_VALUE)
  checks.done()
  const dir = options.dir
  const locks = new LockFiles(leaseMs)
  const owner = new FileOwner(dir, locks)
  const slots = new SlotPool(dir, owner.token)
  const cells = new CellPool(dir, owner.token)
  const sections = new Map<string, Section>()
  // The cells of intents this store created or found by listing; a cell may have been emptied since.
  const cellOf = new Map<string, Place>()
  let sink: StoreEventSink | undefined
  let ready: Promise<unknown> | undefined
  const ensureDir = () => {
    ready ??= mkdir(dir, { recursive: true }).catch((error) => {
      ready = undefined
      throw fsError(error)
    })
    return ready
  }
  // Ids can hold any character; a hash makes a safe, fixed-length file name.
  const nameOf = (id: string) => createHash('sha256').update(id).digest('hex').slice(0, 40)
  const fileOf = (id: string) => join(dir, `${nameOf(id)}.json`)
  const lockOf = (id: string) => join(dir, `${nameOf(id)}.lock`)
  // The newer, unflushed version of a record written by earlier versions of this store.
  const legacyLaterOf = (file: string) => file.replace(/\.json$/, '.later')

  const quarantine = async (file: string, reason: string) => {
    const target = join(dir, QUARANTINE, `${file.slice(dir.length + 1)}.${Date.now()}`)
    try {
      await mkdir(join(dir, QUARANTINE), { recursive: true })
      await rename(file, target)
    } catch (error) {
      if (errno(error) !== 'ENOENT') throw fsError(error)
      return
    }
    sink?.('quarantined', { store: 'file', id: '', location: target, reason })
  }

  const readPlace = async (place: Place): Promise<Content | undefined> => {
    try {
      if (place.cell === undefined) return parse(await readFile(place.path))
      const handle = await open(place.path, 'r')
      try {
        const bytes = Buffer.alloc(CELL_BYTES)
        const { bytesRead } = await handle.read(bytes, 0, CELL_BYTES, place.cell)
        return parse(bytes.subarray(0, bytesRead))
      } finally {
        await handle.close()
      }
    } catch (error) {
      if (errno(error) === 'ENOENT') return undefined
      throw fsError(error)
    }
  }

  // The record a file of its own holds, read with its later version when an earlier version of this store wrote
  // it, and its chain when it is one; a corrupt file is quarantined.
  const recordOf = async (
    path: string,
    content: Content | undefined,
  ): Promise<{ record: IntentRecord; chain?: Chain } | undefined> => {
    if (content?.kind === 'chain') return { record: content.chain.record, chain: content.chain }
    if (content?.kind === 'legacy') {
      const later = await readFile(legacyLaterOf(path), 'utf8').then(
        (text) => JSON.parse(text) as unknown,
        () => undefined,
      )
      const newer = isIntentRecord(later) && later.id === content.record.id && isNewer(later, content.record)
      return { record: newer ? later : content.record }
    }
    if (content?.kind === 'corrupt') await quarantine(path, content.reason)
    return undefined
  }

  // Intent `id`: from its own file, else from the cell this store knows for it (a file there holding another
  // intent, after a power loss undid renames, is left for list() to put in its place).
  const readIntent = async (
    id: string,
  ): Promise<{ record: IntentRecord; place: Place; chain?: Chain } | undefined> => {
    const path = fileOf(id)
    const found = await recordOf(path, await readPlace({ path }))
    if (found?.record.id === id) return { ...found, place: { path } }
    const place = cellOf.get(id)
    const content = place && (await readPlace(place))
    if (place && content?.kind === 'chain' && content.chain.record.id === id) {
      return { record: content.chain.record, chain: content.chain, place }
    }
    return undefined
  }

  // Writes `record` as a new chain into a slot, flushes it, and renames the slot to `file` (replacing what was
  // there). A failure empties and removes the slot before rejecting: a write-ahead reported as failed never comes
  // back.
  const writeAheadToFile = async (record: IntentRecord, ownerToken: string | null): Promise<Open> => {
    const { bytes, chain } = firstFrame(record, ownerToken)
    const slot = await slots.take()
    try {
      writeAt(slot.handle, bytes, 0)
      await slot.handle.datasync()
      const path = fileOf(record.id)
      await rename(slot.path, path)
      return { place: { path }, chain, handle: slot.handle }
    } catch (error) {
      try {
        writeAt(slot.handle, emptied(owner.token, bytes.length), 0)
      } catch {}
      await slot.handle.close().catch(() => {})
      await unlink(slot.path).catch(() => {})
      throw fsError(error)
    }
  }

  // Writes a new intent's record into a cell and flushes it (a record too large for a cell gets a file instead).
  // A failure empties the cell before rejecting.
  const writeAheadToCell = async (record: IntentRecord): Promise<Open> => {
    const { bytes, chain } = firstFrame(record, owner.token)
    if (bytes.length > CELL_BYTES) return writeAheadToFile(record, owner.token)
    const cell = await cells.take()
    try {
      writeAt(cell.handle, bytes, cell.offset)
      await cell.handle.datasync()
    } catch (error) {
      try {
        writeAt(cell.handle, emptied(owner.token, bytes.length), cell.offset)
        await cell.handle.datasync()
      } catch {}
      await cells.emptied(cell.path)
      throw fsError(error)
    }
    const place = { path: cell.path, cell: cell.offset }
    cellOf.set(record.id, place)
    return { place, chain, handle: cell.handle, shared: true }
  }

  const handleOf = async (file: Open): Promise<FileHandle | undefined> => {
    try {
      file.handle ??= await open(file.place.path, 'r+')
      return file.handle
    } catch (error) {
      if (errno(error) === 'ENOENT') return undefined
      throw fsError(error)
    }
  }

  const closeOpen = async (file: Open | undefined) => {
    if (!file?.shared) await file?.handle?.close().catch(() => {})
  }

  // Appends a later version of `record` to its chain, without a flush. A record that is gone (deleted or
  // discarded meanwhile) stays gone. A version that no longer fits its cell moves the intent to a file of its own
  // (a durable write, then the cell is emptied); one written by an earlier version of this store is rewritten as
  // a chain.
  const append = async (record: IntentRecord, section: Section | undefined): Promise<void> => {
    if (section?.deleted) return
    const ownerToken = section?.owned ? owner.token : null
    let current = section?.file
    if (!current) {
      const found = await readIntent(record.id)
      if (!found) return
      current = found.chain && { place: found.place, chain: found.chain }
    }
    const next = current && nextFrame(current.chain, record, ownerToken)
    if (!current || !next || (current.place.cell !== undefined && next.chain.end > CELL_BYTES)) {
      const moved = await writeAheadToFile(record, ownerToken)
      if (current?.place.cell !== undefined) {
        cellOf.delete(record.id)
        await emptyCell(current, false)
      }
      if (section) section.file = moved
      else await closeOpen(moved)
      return
    }
    const handle = await handleOf(current)
    if (!handle) return
    try {
      writeAt(handle, next.bytes, (current.place.cell ?? 0) + current.chain.end)
    } finally {
      if (!section) await closeOpen(current)
    }
    current.chain = next.chain
    if (section) section.file = current
  }

  // Empties a cell in place, zeros over its whole chain so that no byte of the record stays on disk (flushed when
  // `durable`): it no longer holds a record, and is never used again.
  const emptyCell = async (
    file: Pick<Open, 'place' | 'handle' | 'shared'> & { chain?: Chain },
    durable: boolean,
  ) => {
    const handle = file.handle ?? (await open(file.place.path, 'r+').catch(() => undefined))
    if (!handle) return
    try {
      writeAt(handle, emptied(owner.token, file.chain?.end), file.place.cell!)
      if (durable) {
        try {
          await handle.datasync()
        } catch (error) {
          throw fsError(error)
        }
      }
    } finally {
      if (!file.shared) await handle.close().catch(() => {})
    }
    await cells.emptied(file.place.path)
  }

  // Whether a store other than this one created intent `id`, still runs, and has not let go of it.
  const ownedByAnother = async (id: string): Promise<boolean> => {
    const token = (await readIntent(id))?.chain?.owner ?? null
    return token !== null && token !== owner.token && (await owner.alive(token))
  }

  // Ends a section: lets go of an intent this store created and that is still pending (a version naming no owner,
  // so any process may drive it under its lock from now on).
  const endSection = async (id: string, section: Section) => {
    sections.delete(id)
    try {
      if (!section.deleted && section.owned && section.file?.chain.owner === owner.token) {
        await append(section.file.chain.record, { ...section, owned: false })
      }
    } catch {
      // Best effort: an intent not let go of is this store's to drive until it closes or exits, then any process's.
    }
    await closeOpen(section.file)
  }

  // Puts a record found at the wrong name in place: one left in a slot by a store that died between flushing a
  // write-ahead record and renaming it, or any file after a power loss undid renames. The newer record of an intent
  // wins. A record whose writer is alive (its owner runs, or it holds the intent's lock) is still being written.
  const recover = async (path: string, chain: Chain): Promise<IntentRecord | undefined> => {
    const id = chain.record.id
    if (chain.owner !== null && (await owner.alive(chain.owner))) return undefined
    const token = randomBytes(8).toString('hex')
    const lock = lockOf(id)
    if (!(await locks.take(lock, () => locks.text(Date.now() + leaseMs, token)))) return undefined
    try {
      const there = await readIntent(id)
      if (there && !isNewer(chain.record, there.record)) {
        await unlink(path).catch(() => {})
        return undefined
      }
      await rename(path, fileOf(id))
      return there ? undefined : chain.record
    } finally {
      await unlink(lock).catch(() => {})
    }
  }

  // The records of one cells file, remembered for get(). The file is removed once no cell can hold a record any
  // more: every cell emptied, or, when its store is gone, no cell holding one. (A cell of a live store that reads
  // as neither may be a write-ahead being written right now.)
  const listCells = async (path: string, alive: boolean): Promise<IntentRecord[]> => {
    let bytes: Buffer
    try {
      bytes = await readFile(path)
    } catch (error) {
      if (errno(error) === 'ENOENT') return []
      throw fsError(error)
    }
    const records: IntentRecord[] = []
    let emptiedCells = 0
    for (let cell = 0; cell < CELLS; cell++) {
      const content = parse(bytes.subarray(cell * CELL_BYTES, (cell + 1) * CELL_BYTES))
      if (content.kind === 'chain') {
        records.push(content.chain.record)
        cellOf.set(content.chain.record.id, { path, cell: cell * CELL_BYTES })
      } else if (content.kind === 'free' && content.owner) emptiedCells++
    }
    if (alive ? emptiedCells === CELLS : records.length === 0) await unlink(path).catch(() => {})
    return records
  }

  const list = async (): Promise<IntentRecord[]> => {
    await ensureDir()
    const names = await readdir(dir).catch((error) => {
      throw fsError(error)
    })
    const verdicts = new Map<string, Promise<boolean>>()
    const alive = (token: string) => {
      if (!verdicts.has(token)) verdicts.set(token, owner.alive(token))
      return verdicts.get(token)!
    }
    const found = new Map<string, IntentRecord>()
    const keep = (record: IntentRecord | undefined) => {
      const other = record && found.get(record.id)
      if (record && (!other || isNewer(record, other))) found.set(record.id, record)
    }
    const legacy = new Set<string>()
    await Promise.all(
      names.map(async (name) => {
        const path = join(dir, name)
        if (name.endsWith('.json')) {
          const content = await readPlace({ path })
          if (content?.kind === 'legacy') legacy.add(name)
          if (content?.kind === 'chain' && `${nameOf(content.chain.record.id)}.json` !== name) {
            keep(await recover(path, content.chain))
          } else if (content?.kind === 'free') {
            await unlink(path).catch(() => {}) // a file of its own is removed, not emptied: a leftover
          } else {
            keep((await recordOf(path, content))?.record)
          }
          return
        }
        const cellsOwner = CellPool.ownerOf(name)
        if (cellsOwner) {
          for (const record of await listCells(path, await alive(cellsOwner))) keep(record)
          return
        }
        const slotOwner = SlotPool.ownerOf(name)
        if (slotOwner && !(await alive(slotOwner))) {
          const content = await readPlace({ path })
          if (content?.kind === 'chain') keep(await recover(path, content.chain))
          else await unlink(path).catch(() => {})
        }
      }),
    )
    // Later versions written by an earlier version of this store, once their record is rewritten or gone.
    for (const name of names) {
      if (name.endsWith('.later') && !legacy.has(name.replace(/\.later$/, '.json'))) {
        await unlink(join(dir, name)).catch(() => {})
      }
    }
    // Owner files of stores that are gone and left no slots or cells behind.
    const owners = new Set(names.map((name) => SlotPool.ownerOf(name) ?? CellPool.ownerOf(name)))
    for (const name of names) {
      const token = /^([0-9a-f]{16})\.owner$/.exec(name)?.[1]
      if (token && !owners.has(token) && !(await alive(token))) await unlink(join(dir, name)).catch(() => {})
    }
    return [...found.values()]
  }

  return {
    attach(next) {
      sink = next
    },
    async get(id) {
      await ensureDir()
      const found = await readIntent(id)
      const section = sections.get(id)
      if (section && found?.chain && found.chain.digest !== section.file?.chain.digest) {
        // The section appends to the chain it read last.
        await closeOpen(section.file)
        section.file = { place: found.place, chain: found.chain }
      }
      return found?.record
    },
    async set(record, writeOptions) {
      await ensureDir()
      const section = sections.get(record.id)
      if (writeOptions?.durable === false) return append(record, section)
      const previous = section?.file ?? (await readIntent(record.id))
      const written = await writeAheadToFile(record, section?.owned ? owner.token : null)
      // A cell that held an earlier record of this intent no longer does: the new file supersedes it.
      if (previous?.place.cell !== undefined) await emptyCell(previous, false).catch(() => {})
      cellOf.delete(record.id)
      if (!section) return closeOpen(written)
      await closeOpen(section.file)
      section.file = written
      section.deleted = false
    },
    async delete(id, writeOptions) {
      await ensureDir()
      const durable = writeOptions?.durable !== false
      const section = sections.get(id)
      let file: Pick<Open, 'place' | 'handle' | 'shared'> | undefined = section?.file
      if (!file) {
        // An intent created by another store that this one has not listed yet is found by listing.
        file = (await readIntent(id)) ?? (durable ? await list().then(() => readIntent(id)) : undefined)
      }
      if (section) section.deleted = true
      if (file?.place.cell !== undefined) {
        cellOf.delete(id)
        return emptyCell(file, durable)
      }
      if (section) {
        await closeOpen(section.file)
        section.file = undefined
      }
      const path = fileOf(id)
      await removeIfPresent(legacyLaterOf(path))
      await removeIfPresent(path)
      if (durable) await syncDir(dir)
    },
    list,
    async exclusive<T>(id: string, fn: () => Promise<T>): Promise<ExclusiveResult<T>> {
      await ensureDir()
      const lock = lockOf(id)
      // The token tells this claim's lock file from any other's, this process's included.
      const token = randomBytes(8).toString('hex')
      const since = Date.now()
      if (!(await locks.take(lock, () => locks.text(since + leaseMs, token)))) return { acquired: false }
      // An intent whose creator still runs and drives it, here or in another process, is not taken from it.
      if (sections.has(id) || (await ownedByAnother(id).catch(() => false))) {
        await unlink(lock).catch(() => {})
        return { acquired: false }
      }
      const claim = new HeldClaim('file', id, () => sink)
      claim.lease(leaseMs, since, (until) => locks.renew(lock, token, () => locks.text(until, token)))
      const section: Section = { claim, owned: false }
      sections.set(id, section)
      const value = await claim.run(fn, async () => {
        await endSection(id, section)
        // A lost claim's lock file is left alone: it may be another process's by now.
        if (!claim.lost) await unlink(lock).catch(() => {})
      })
      return { acquired: true, value }
    },
    async create<T>(record: IntentRecord, fn: () => Promise<T>): Promise<T> {
      await ensureDir()
      cells.prepare()
      await owner.ready().catch((error: unknown) => {
        throw fsError(error)
      })
      const id = record.id
      const claim = new HeldClaim('file', id, () => sink)
      const section: Section = { claim, owned: true }
      sections.set(id, section)
      owner.sections.set(id, claim)
      try {
        section.file = await writeAheadToCell(record)
      } catch (error) {
        sections.delete(id)
        owner.sections.delete(id)
        throw error
      }
      return claim.run(fn, async () => {
        owner.sections.delete(id)
        await endSection(id, section)
      })
    },
    async close() {
      await cells.close()
      await slots.close()
      await owner.close()
    },
  }
}

function isNewer(a: IntentRecord, b: IntentRecord): boolean {
  return a.createdAt > b.createdAt || (a.createdAt === b.createdAt && a.version > b.version)
}
