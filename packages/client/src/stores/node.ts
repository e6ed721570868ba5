import { createHash, randomBytes } from 'node:crypto'
import { type FileHandle, mkdir, open, readdir, readFile, rename, stat, unlink } from 'node:fs/promises'
import { join } from 'node:path'
import { type IntentRecord, isIntentRecord } from '../intent.js'
import type { ExclusiveResult, IntentStore, StoreEventSink } from '../store.js'
import { OptionChecks } from '../validate.js'
import { HeldClaim } from './claim.js'
import { errno, fsError, removeIfPresent, syncDir } from './file/fs.js'
import { LockFiles } from './file/lock.js'
import { FileOwner } from './file/owner.js'
import {
  type Chain,
  type Content,
  firstFrame,
  HEADER_BYTES,
  nextFrame,
  parse,
  ZERO_HEADER,
} from './file/records.js'
import { SlotPool } from './file/slots.js'

/** Options of {@link fileStore}. */
export interface FileStoreOptions {
  /**
   * Directory holding one file per intent (created if missing). Processes sharing it share their intents; it must
   * be on a local file system of this machine.
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

// One intent this store drives right now: under its per-intent lock, or as the owner of an intent it created.
interface Section {
  claim: HeldClaim
  /** Driven as its creator and owner, without a per-intent lock. */
  owned: boolean
  /** The intent's file as last read or written in this section, open once the section writes to it. */
  file?: { chain: Chain; handle?: FileHandle }
  /** Deleted in this section; `recycle` when its file was emptied in place and can serve as a slot again. */
  deleted?: 'unlinked' | 'recycle'
}

/**
 * Keeps intents as files for Node, one per intent, named after a hash of its id, which every process sharing `dir`
 * reads. The write-ahead record of a mutation costs one flush: it is written over the start of a slot (a file
 * created, zero-filled and flushed ahead of time, its name flushed too, so nothing about it but the new bytes
 * needs flushing), made durable with one fdatasync, and renamed to the intent's name. Later versions (attempt
 * counters, outcomes) are appended to the same file without a flush, each chained to the one before by a digest,
 * so a torn or stale version is never read: a crash of the process loses nothing that was written, and a power
 * loss may only lose versions after the write-ahead one, which `resume()` then resends with the same key for the
 * server to replay. The driver of an intent deletes it by zeroing its first header in place (the file then serves
 * as a slot again); `discard` unlinks it and flushes the directory.
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
  const pool = new SlotPool(dir, owner.token)
  const sections = new Map<string, Section>()
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

  const quarantine = async (file: string, id: string, reason: string) => {
    const target = join(dir, QUARANTINE, `${file.slice(dir.length + 1)}.${Date.now()}`)
    try {
      await mkdir(join(dir, QUARANTINE), { recursive: true })
      await rename(file, target)
    } catch (error) {
      if (errno(error) !== 'ENOENT') throw fsError(error)
      return
    }
    sink?.('quarantined', { store: 'file', id, location: target, reason })
  }

  const readContent = async (file: string): Promise<Content | undefined> => {
    try {
      return parse(await readFile(file))
    } catch (error) {
      if (errno(error) === 'ENOENT') return undefined
      throw fsError(error)
    }
  }

  // The record a file holds, read with its later version when an earlier version of this store wrote it, and its
  // chain when it is one; a corrupt file is quarantined.
  const recordOf = async (
    file: string,
    content: Content | undefined,
  ): Promise<{ record: IntentRecord; chain?: Chain } | undefined> => {
    if (content?.kind === 'chain') return { record: content.chain.record, chain: content.chain }
    if (content?.kind === 'legacy') {
      const later = await readFile(legacyLaterOf(file), 'utf8').then(
        (text) => JSON.parse(text) as unknown,
        () => undefined,
      )
      const newer = isIntentRecord(later) && later.id === content.record.id && isNewer(later, content.record)
      return { record: newer ? later : content.record }
    }
    if (content?.kind === 'corrupt') await quarantine(file, '', content.reason)
    return undefined
  }

  // Intent `id` from its file. A file there holding another intent (after a power loss undid renames) is left
  // for list() to put in its place.
  const readIntent = async (id: string) => {
    const file = fileOf(id)
    const found = await recordOf(file, await readContent(file))
    return found?.record.id === id ? found : undefined
  }

  // Writes `record` as a new chain into a slot, flushes it, and renames it to `file` (replacing what was there).
  // A failure empties and removes the slot before rejecting: a write-ahead reported as failed never comes back.
  const writeAhead = async (record: IntentRecord, file: string, ownerToken: string | null) => {
    const slot = await pool.take()
    const { bytes, chain } = firstFrame(record, ownerToken)
    try {
      await slot.handle.write(bytes, 0, bytes.length, 0)
      await slot.handle.datasync()
      await rename(slot.path, file)
    } catch (error) {
      await slot.handle.write(ZERO_HEADER, 0, HEADER_BYTES, 0).catch(() => {})
      await slot.handle.close().catch(() => {})
      await unlink(slot.path).catch(() => {})
      throw fsError(error)
    }
    await removeIfPresent(legacyLaterOf(file)).catch(() => {})
    return { chain, handle: slot.handle }
  }

  // Appends a later version of `record` to its chain, without a flush. A record that is gone (deleted or
  // discarded meanwhile) stays gone; one written by an earlier version of this store is rewritten as a chain.
  const append = async (record: IntentRecord, section: Section | undefined) => {
    const file = fileOf(record.id)
    const ownerToken = section?.owned ? owner.token : null
    let current = section?.file
    if (!current) {
      const found = await readIntent(record.id)
      if (!found) return
      if (!found.chain) {
        const written = await writeAhead(record, file, ownerToken)
        if (section) section.file = written
        else await written.handle.close().catch(() => {})
        return
      }
      current = { chain: found.chain }
    }
    try {
      current.handle ??= await open(file, 'r+')
    } catch (error) {
      if (errno(error) === 'ENOENT') return
      throw fsError(error)
    }
    const { bytes, chain } = nextFrame(current.chain, record, ownerToken)
    try {
      await current.handle.write(bytes, 0, bytes.length, current.chain.end)
    } catch (error) {
      throw fsError(error)
    } finally {
      if (!section) await current.handle.close().catch(() => {})
    }
    current.chain = chain
    if (section) section.file = current
  }

  // Whether a store other than this one created intent `id`, still runs, and has not let go of it.
  const ownedByAnother = async (id: string): Promise<boolean> => {
    const content = await readContent(fileOf(id))
    const token = content?.kind === 'chain' ? content.chain.owner : null
    return token !== null && token !== owner.token && (await owner.alive(token))
  }

  // Ends a section: gives an emptied file back to the pool, or lets go of an intent this store created and that
  // is still pending (a version naming no owner, so any process may drive it under its lock from now on).
  const endSection = async (id: string, section: Section) => {
    sections.delete(id)
    const handle = section.file?.handle
    try {
      if (section.deleted === 'recycle' && handle) {
        const file = fileOf(id)
        const [mine, named] = await Promise.all([handle.stat(), stat(file)])
        if (mine.ino === named.ino) {
          const slot = pool.name()
          await rename(file, slot)
          await pool.give(slot, handle)
          return
        }
      } else if (!section.deleted && section.owned && section.file?.chain.owner === owner.token) {
        await append(section.file.chain.record, { ...section, owned: false })
      }
    } catch {
      // Best effort: an emptied file left in place reads as no record, and an intent not let go of is this
      // store's to drive until it closes or exits, then any process's.
    }
    await handle?.close().catch(() => {})
  }

  // Puts a record found at the wrong name in place: a slot of a store that died between flushing a write-ahead
  // record and renaming it, or any file after a power loss undid renames. The newer record of an intent wins.
  const recover = async (path: string, chain: Chain): Promise<IntentRecord | undefined> => {
    const id = chain.record.id
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
    const records: IntentRecord[] = []
    await Promise.all(
      names.map(async (name) => {
        const path = join(dir, name)
        if (name.endsWith('.json')) {
          const content = await readContent(path)
          if (content?.kind === 'chain' && `${nameOf(content.chain.record.id)}.json` !== name) {
            const recovered = await recover(path, content.chain)
            if (recovered) records.push(recovered)
          } else if (content?.kind === 'free') {
            // Emptied by a driver that died before giving it back to its pool.
            const stats = await stat(path).catch(() => undefined)
            if (stats && Date.now() - stats.mtimeMs > leaseMs) await unlink(path).catch(() => {})
          } else {
            const found = await recordOf(path, content)
            if (found) records.push(found.record)
          }
          return
        }
        const slotOwner = SlotPool.ownerOf(name)
        if (slotOwner && !(await alive(slotOwner))) {
          const content = await readContent(path)
          const recovered = content?.kind === 'chain' ? await recover(path, content.chain) : undefined
          if (recovered) records.push(recovered)
          else if (content?.kind !== 'chain') await unlink(path).catch(() => {})
        }
      }),
    )
    // Owner files of stores that are gone and left no slots behind.
    const slotOwners = new Set(names.map((name) => SlotPool.ownerOf(name)))
    for (const name of names) {
      const token = /^([0-9a-f]{16})\.owner$/.exec(name)?.[1]
      if (token && !slotOwners.has(token) && !(await alive(token)))
        await unlink(join(dir, name)).catch(() => {})
    }
    return records
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
        await section.file?.handle?.close().catch(() => {})
        section.file = { chain: found.chain }
      }
      return found?.record
    },
    async set(record, writeOptions) {
      await ensureDir()
      const section = sections.get(record.id)
      if (writeOptions?.durable === false) return append(record, section)
      const written = await writeAhead(record, fileOf(record.id), section?.owned ? owner.token : null)
      if (!section) return written.handle.close()
      await section.file?.handle?.close().catch(() => {})
      section.file = written
      section.deleted = undefined
    },
    async delete(id, writeOptions) {
      await ensureDir()
      const section = sections.get(id)
      const handle = section?.file?.handle
      if (section && handle && writeOptions?.durable === false) {
        // The driver deletes the intent it drives: its file no longer holds a record once its first header is
        // zeroed, and becomes a slot again when the section ends.
        try {
          await handle.write(ZERO_HEADER, 0, HEADER_BYTES, 0)
        } catch (error) {
          throw fsError(error)
        }
        section.deleted = 'recycle'
        return
      }
      if (section) section.deleted = 'unlinked'
      const file = fileOf(id)
      await removeIfPresent(legacyLaterOf(file))
      await removeIfPresent(file)
      if (writeOptions?.durable !== false) await syncDir(dir)
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
      pool.prepare()
      await owner.ready().catch((error: unknown) => {
        throw fsError(error)
      })
      const id = record.id
      const claim = new HeldClaim('file', id, () => sink)
      const section: Section = { claim, owned: true }
      sections.set(id, section)
      owner.sections.set(id, claim)
      try {
        section.file = await writeAhead(record, fileOf(id), owner.token)
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
      await pool.close()
      await owner.close()
    },
  }
}

function isNewer(a: IntentRecord, b: IntentRecord): boolean {
  return a.createdAt > b.createdAt || (a.createdAt === b.createdAt && a.version > b.version)
}
