import { createHash, randomBytes } from 'node:crypto'
import { mkdir, open, readdir, readFile, rename, stat, unlink } from 'node:fs/promises'
import { join } from 'node:path'
import { QuotaExceededError } from '../errors/quota-exceeded-error.js'
import { StorageError } from '../errors/storage-error.js'
import { type IntentRecord, isIntentRecord } from '../intent.js'
import type { ExclusiveResult, IntentStore, StoreEventSink } from '../store.js'

/** Options of {@link fileStore}. */
export interface FileStoreOptions {
  /**
   * Directory holding one JSON file per intent (created if missing). Processes sharing it share their intents.
   * @example '.oncely'
   */
  dir: string
  /**
   * How long a process's claim on an intent lasts without renewal; a claim held by a process that no longer exists
   * is taken over at once. The holder renews it every `leaseMs / 3`. When a renewal fails, the lease runs out before
   * one succeeds, or another process replaced the lock file, the claim is lost: `exclusive` then rejects with
   * `StorageError` once its section settles (the section's own error wins), and leaves the lock file alone.
   * @default 10_000
   */
  leaseMs?: number
}

const QUARANTINE = 'quarantine'

/**
 * Keeps intents as files for Node. Each intent has a write-ahead file, written before anything is sent: a
 * temporary file that is fsynced, renamed over the old one, and the directory fsynced. Later writes (attempt
 * counters, outcomes; `{ durable: false }`) go to a second file the same way but without the fsyncs, so they cost
 * no disk flush: a crash may lose them, or even leave that second file torn on some file systems, and the intent
 * then reads as its write-ahead version, which `resume()` resends with the same key for the server to replay.
 * Unreadable write-ahead files are moved to `<dir>/quarantine/` with a `quarantined` event instead of crashing
 * the client.
 *
 * @example
 * import { fileStore } from '@oncely/client/node'
 * createClient({ baseUrl, store: fileStore({ dir: '.oncely' }) })
 */
export function fileStore(options: FileStoreOptions): IntentStore {
  if (typeof options?.dir !== 'string' || options.dir === '') {
    throw new TypeError('Expected `dir` to be a non-empty directory path')
  }
  const dir = options.dir
  const leaseMs = options.leaseMs ?? 10_000
  if (!(leaseMs > 0))
    throw new TypeError(`Expected \`leaseMs\` to be a positive number, got ${String(leaseMs)}`)
  let sink: StoreEventSink | undefined
  let ready: Promise<unknown> | undefined
  const ensureDir = () => {
    ready ??= mkdir(dir, { recursive: true }).catch((error) => {
      ready = undefined
      throw toStorageError(error)
    })
    return ready
  }
  // Ids can hold any character; a hash makes a safe, fixed-length file name.
  const fileOf = (id: string) =>
    join(dir, `${createHash('sha256').update(id).digest('hex').slice(0, 40)}.json`)
  // The newer, unflushed version of a record (see the doc comment above).
  const laterOf = (file: string) => file.replace(/\.json$/, '.later')

  const syncDir = async () => {
    const handle = await open(dir, 'r')
    try {
      await handle.sync()
    } finally {
      await handle.close()
    }
  }

  const quarantine = async (file: string, id: string, reason: string) => {
    const target = join(dir, QUARANTINE, `${file.slice(dir.length + 1)}.${Date.now()}`)
    try {
      await mkdir(join(dir, QUARANTINE), { recursive: true })
      await rename(file, target)
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw toStorageError(error)
      return
    }
    sink?.('quarantined', { store: 'file', id, location: target, reason })
  }

  const read = async (file: string, expectedId?: string): Promise<IntentRecord | undefined> => {
    let text: string
    try {
      text = await readFile(file, 'utf8')
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined
      throw toStorageError(error)
    }
    let value: unknown
    try {
      value = JSON.parse(text)
    } catch (error) {
      await quarantine(file, expectedId ?? '', `not JSON: ${(error as Error).message}`)
      return undefined
    }
    if (!isIntentRecord(value) || (expectedId !== undefined && value.id !== expectedId)) {
      await quarantine(file, expectedId ?? '', 'not an intent record')
      return undefined
    }
    return value
  }

  // The write-ahead record, replaced by its later version when that one is whole and newer. A later version is
  // expected to be torn or stale after a crash, so it is ignored rather than quarantined.
  const readLatest = async (file: string, expectedId?: string): Promise<IntentRecord | undefined> => {
    const base = await read(file, expectedId)
    if (!base) return undefined
    let later: unknown
    try {
      later = JSON.parse(await readFile(laterOf(file), 'utf8'))
    } catch {
      return base // missing, unreadable or torn: the write-ahead version stands
    }
    return isIntentRecord(later) && later.id === base.id && isNewer(later, base) ? later : base
  }

  const write = async (file: string, text: string, durable: boolean) => {
    const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`
    try {
      const handle = await open(tmp, 'w')
      try {
        await handle.writeFile(text)
        if (durable) await handle.sync()
      } finally {
        await handle.close()
      }
      await rename(tmp, file)
      if (durable) await syncDir()
    } catch (error) {
      await unlink(tmp).catch(() => {})
      throw toStorageError(error)
    }
  }

  // A lock file per intent naming its holder and claim token; stale when its process is gone or its lease ran out.
  // The server's key check remains the guarantee; the lock keeps two processes from driving one intent at once.
  const lockOf = (id: string) => fileOf(id).replace(/\.json$/, '.lock')

  // What a lock (or takeover marker) file says: absent; held by a live holder within its lease; or stale, with the
  // exact state judged stale, which a takeover checks again before replacing it. A lock file is written after it
  // is created, so a holder killed in between leaves it empty or torn. Such a file may also belong to a live holder
  // that is still writing it: it counts as held until it is older than the lease.
  const inspect = async (path: string): Promise<'absent' | 'held' | { stale: string }> => {
    let text: string
    try {
      text = await readFile(path, 'utf8')
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return 'absent'
      throw toStorageError(error)
    }
    const holder = holderOf(text)
    if (holder) return holder.until > Date.now() && isAlive(holder.pid) ? 'held' : { stale: text }
    let stats: Awaited<ReturnType<typeof stat>>
    try {
      stats = await stat(path)
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return 'absent'
      throw toStorageError(error)
    }
    if (Date.now() - stats.mtimeMs < leaseMs) return 'held'
    return { stale: `${text}\n${stats.ino}:${stats.mtimeMs}` }
  }

  // Creates `path` with `text` unless it exists.
  const create = async (path: string, text: string): Promise<boolean> => {
    let handle: Awaited<ReturnType<typeof open>>
    try {
      handle = await open(path, 'wx')
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'EEXIST') return false
      throw toStorageError(error)
    }
    try {
      await handle.writeFile(text)
      await handle.close()
    } catch (error) {
      await handle.close().catch(() => {})
      await unlink(path).catch(() => {})
      throw toStorageError(error)
    }
    return true
  }

  const takeLock = async (lock: string, body: () => string): Promise<boolean> => {
    for (let attempt = 0; attempt < 3; attempt++) {
      if (await create(lock, body())) return true
      const seen = await inspect(lock)
      if (seen === 'held') return false
      if (seen !== 'absent') return takeOver(lock, seen.stale, body)
    }
    return false
  }

  // Replaces a stale lock file with this claim's, as a compare-and-swap. The takers of one stale state take turns
  // through a marker file named after it (created exclusively), and the one whose turn it is renames its lock over
  // the stale one only if the lock is still exactly what it judged stale. The lock path never goes missing, so no
  // one can create it meanwhile, and a taker whose judgment is out of date finds the lock changed and backs off.
  // A taker that died holding a marker leaves it stale; the next taker uses the next marker.
  const takeOver = async (lock: string, stale: string, body: () => string): Promise<boolean> => {
    const tag = createHash('sha256').update(stale).digest('hex').slice(0, 16)
    const marker = (generation: number) => `${lock}.${tag}.${generation}.take`
    for (let generation = 0, tries = 0; tries < 8; tries++) {
      if (
        await create(marker(generation), JSON.stringify({ pid: process.pid, until: Date.now() + leaseMs }))
      ) {
        try {
          const now = await inspect(lock)
          if (typeof now !== 'object' || now.stale !== stale) return false
          await write(lock, body(), false) // a temp file renamed over the stale lock: one atomic step
          return true
        } finally {
          for (let previous = generation; previous >= 0; previous--) {
            await unlink(marker(previous)).catch(() => {})
          }
        }
      }
      const other = await inspect(marker(generation))
      if (other === 'held') return false // another process is taking this lock over right now
      if (other !== 'absent') generation++ // its taker died before finishing
    }
    return false
  }

  return {
    attach(next) {
      sink = next
    },
    async get(id) {
      await ensureDir()
      return readLatest(fileOf(id), id)
    },
    async set(record, options) {
      await ensureDir()
      const file = fileOf(record.id)
      if (options?.durable === false) return write(laterOf(file), JSON.stringify(record), false)
      // A stale later version must not shadow this one; the directory fsync below makes the unlink durable too.
      await removeIfPresent(laterOf(file))
      await write(file, JSON.stringify(record), true)
    },
    async delete(id, options) {
      await ensureDir()
      const file = fileOf(id)
      await removeIfPresent(laterOf(file))
      await removeIfPresent(file)
      if (options?.durable !== false) {
        await syncDir().catch((error) => {
          throw toStorageError(error)
        })
      }
    },
    async list() {
      await ensureDir()
      const names = (
        await readdir(dir).catch((error) => {
          throw toStorageError(error)
        })
      ).filter((name) => name.endsWith('.json'))
      const records = await Promise.all(names.map((name) => readLatest(join(dir, name))))
      return records.filter((record): record is IntentRecord => record !== undefined)
    },
    async exclusive<T>(id: string, fn: () => Promise<T>): Promise<ExclusiveResult<T>> {
      await ensureDir()
      const lock = lockOf(id)
      // The token tells this claim's lock file from any other's, this process's included.
      const token = randomBytes(8).toString('hex')
      let until = Date.now() + leaseMs
      const body = () => JSON.stringify({ pid: process.pid, until, token })
      if (!(await takeLock(lock, body))) return { acquired: false }
      // Set once the claim can no longer be vouched for: the lease ran out before a renewal, a renewal failed, or
      // the lock file is no longer this claim's. Another process may be driving the intent from then on.
      let lost: StorageError | undefined
      const lose = (reason: string, cause?: unknown) => {
        if (lost) return
        lost = new StorageError(
          `fileStore lost its claim on intent ${JSON.stringify(id)}: ${reason}; another process may drive it now`,
          cause === undefined ? undefined : { cause },
        )
        // Now, not when the section ends: the section may be a request that takes a while yet.
        sink?.('claim-lost', { store: 'file', id, reason, error: lost })
      }
      const renewOnce = async () => {
        if (Date.now() >= until) return lose('its lease ran out before it was renewed')
        let text: string
        try {
          text = await readFile(lock, 'utf8')
        } catch (error) {
          return lose('its lock file could not be read', error)
        }
        if (tokenOf(text) !== token) return lose('its lock file was replaced')
        const next = Date.now() + leaseMs
        try {
          await write(lock, JSON.stringify({ pid: process.pid, until: next, token }), false)
        } catch (error) {
          return lose('its lease could not be renewed', (error as Error).cause ?? error)
        }
        until = next
      }
      // One renewal at a time; the release waits for the one in flight, or it could recreate the lock file after
      // the release removed it (a ghost claim keeping everyone out until its lease ran out).
      let renewing: Promise<void> | undefined
      const renew = setInterval(() => {
        if (renewing) return
        if (lost) return clearInterval(renew)
        renewing = renewOnce().finally(() => {
          renewing = undefined
        })
      }, leaseMs / 3)
      renew.unref()
      let value: T
      try {
        value = await fn()
      } finally {
        clearInterval(renew)
        await renewing
        if (!lost && Date.now() >= until) lose('its lease ran out before it was renewed')
        // A lost claim's lock file is left alone: it may be another process's by now.
        if (!lost) await unlink(lock).catch(() => {})
      }
      if (lost) throw lost
      return { acquired: true, value }
    },
  }
}

// The holder a lock or marker file names, if it is whole.
function holderOf(text: string): { pid: number; until: number } | undefined {
  try {
    const holder = JSON.parse(text) as { pid?: unknown; until?: unknown } | null
    if (typeof holder?.pid === 'number' && typeof holder.until === 'number') {
      return { pid: holder.pid, until: holder.until }
    }
  } catch {}
  return undefined
}

// The token of a lock file's claim, if it names one.
function tokenOf(text: string): string | undefined {
  try {
    const token = (JSON.parse(text) as { token?: unknown } | null)?.token
    return typeof token === 'string' ? token : undefined
  } catch {
    return undefined
  }
}

function isNewer(a: IntentRecord, b: IntentRecord): boolean {
  return a.createdAt > b.createdAt || (a.createdAt === b.createdAt && a.version > b.version)
}

async function removeIfPresent(file: string): Promise<void> {
  try {
    await unlink(file)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw toStorageError(error)
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM'
  }
}

function toStorageError(error: unknown): StorageError {
  if (error instanceof StorageError) return error
  const code = (error as NodeJS.ErrnoException).code
  if (code === 'ENOSPC' || code === 'EDQUOT') {
    return new QuotaExceededError(
      `The disk is full (${code}); the intent was not recorded and nothing was sent`,
      {
        cause: error,
      },
    )
  }
  return new StorageError(`File store failed: ${(error as Error).message}`, { cause: error })
}
