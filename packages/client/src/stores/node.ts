import { createHash, randomBytes } from 'node:crypto'
import { type FileHandle, mkdir, open, readdir, readFile, rename, stat, unlink } from 'node:fs/promises'
import { uptime } from 'node:os'
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
   * is taken over at once.
   * @default 10_000
   */
  leaseMs?: number
}

const QUARANTINE = 'quarantine'
const JOURNAL = 'journal'
const REPLAYING = '.replaying'
// A journal is rewritten (its live records copied to a fresh one) after this many entries or bytes.
const ROTATE_ENTRIES = 2000
const ROTATE_BYTES = 8 * 1024 * 1024
// Boot times computed by two processes of one boot differ by rounding only; a reboot moves it by far more.
const SAME_BOOT_MS = 60_000
const bootTime = () => Date.now() - uptime() * 1000

/**
 * Keeps intents as files for Node: one JSON file per intent, which every process sharing `dir` reads, plus one
 * append-only journal per store instance under `<dir>/journal/` that makes the write-ahead record durable.
 *
 * A write-ahead record (written before anything is sent) is appended to the journal with one `fdatasync`, and
 * written to the intent's file by temporary file and rename without a flush. The journal already exists, so its
 * flush needs no directory flush, and a new file's flush (the costly part on ext4) is never on a mutation's path.
 * Each journal line carries a checksum, so a line torn by a crash is ignored. Later writes (attempt counters,
 * outcomes; `{ durable: false }`) go to a second file per intent the same way, without any flush: a crash may lose
 * them, and the intent then reads as its write-ahead version, which `resume()` resends with the same key for the
 * server to replay. Deletes append an unflushed tombstone.
 *
 * The journal of a store whose process is gone (or of an earlier boot) is replayed by the next store that opens
 * `dir` or lists it: every intent whose file is missing, torn or older than its journal record is rewritten from
 * the journal (flushed), the others are flushed as they are, then the journal is removed. A journal is rotated
 * (its live records copied to a fresh, flushed one) every 2000 entries, and removed by `close()` after the live
 * intents' files are flushed. Unreadable intent files are moved to `<dir>/quarantine/` with a `quarantined` event
 * instead of crashing the client.
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
  const journalDir = join(dir, JOURNAL)
  const ensureDir = () => {
    ready ??= (async () => {
      await mkdir(journalDir, { recursive: true })
      await recoverJournals()
    })().catch((error) => {
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

  const syncPath = async (path: string) => {
    const handle = await open(path, 'r')
    try {
      await handle.sync()
    } finally {
      await handle.close()
    }
  }
  const syncDir = () => syncPath(dir)

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

  // The newest whole version of an intent's files, never quarantining (used to replay a journal).
  const peekLatest = async (file: string, id: string): Promise<IntentRecord | undefined> => {
    const parse = async (path: string) => {
      try {
        const value: unknown = JSON.parse(await readFile(path, 'utf8'))
        return isIntentRecord(value) && value.id === id ? value : undefined
      } catch {
        return undefined
      }
    }
    const base = await parse(file)
    if (!base) return undefined
    const later = await parse(laterOf(file))
    return later && isNewer(later, base) ? later : base
  }

  // This instance's journal: `<boot time>.<pid>.<random>.log`, appended by one queue.
  const journalName = () => `${Math.round(bootTime())}.${process.pid}.${randomBytes(6).toString('hex')}.log`
  let journal:
    | { path: string; handle: FileHandle; ino: number; entries: number; bytes: number; torn?: boolean }
    | undefined
  let queue: Promise<unknown> = Promise.resolve()
  // The durable write-ahead line of every intent this journal holds and has not seen deleted.
  const live = new Map<string, string>()

  const createJournal = async (lines: Iterable<string>) => {
    const path = join(journalDir, journalName())
    const handle = await open(path, 'a')
    try {
      let bytes = 0
      let entries = 0
      for (const line of lines) {
        await writeAll(handle, line)
        bytes += Buffer.byteLength(line)
        entries++
      }
      await handle.sync()
      await syncPath(journalDir) // the new journal's name must survive a crash before anything relies on it
      return { path, handle, ino: (await handle.stat()).ino, entries, bytes }
    } catch (error) {
      await handle.close().catch(() => {})
      await unlink(path).catch(() => {})
      throw error
    }
  }

  // Copies the live records into a fresh journal and drops the old one. Records whose file is gone (settled and
  // deleted by another process) are dropped.
  const rotate = async () => {
    for (const id of [...live.keys()]) {
      if (!(await exists(fileOf(id)))) live.delete(id)
    }
    const previous = journal!
    journal = await createJournal(live.values())
    await previous.handle.close().catch(() => {})
    await unlink(previous.path).catch(() => {})
  }

  const append = (entry: JournalEntry, durable: boolean): Promise<void> => {
    const line = journalLine(entry)
    const run = queue.then(async () => {
      journal ??= await createJournal([])
      if (journal.torn || journal.entries >= ROTATE_ENTRIES || journal.bytes >= ROTATE_BYTES) await rotate()
      try {
        await writeAll(journal.handle, line)
      } catch (error) {
        journal.torn = true // a partly written line: the next append starts a fresh journal after it
        throw error
      }
      journal.entries++
      journal.bytes += Buffer.byteLength(line)
      if ('set' in entry) live.set(entry.set.id, line)
      else live.delete(entry.del)
      if (!durable) return
      await journal.handle.datasync()
      // Another store took this journal for a dead one's (a process id from another PID namespace can look
      // dead): it replays what it read after taking it, and this line may be newer, so copy the live records.
      const named = await stat(journal.path).catch(() => undefined)
      if (named?.ino !== journal.ino) await rotate()
    })
    queue = run.catch(() => {})
    return run
  }

  // Makes the files of a dead store's journal stand on their own, then removes the journal. It is renamed first,
  // so a store that still writes it after all notices (see `append`) and copies its live records elsewhere.
  const replay = async (name: string) => {
    const path = join(journalDir, name.endsWith(REPLAYING) ? name : `${name}${REPLAYING}`)
    let text: string
    try {
      if (!name.endsWith(REPLAYING)) await rename(join(journalDir, name), path)
      text = await readFile(path, 'utf8')
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return // another store replays it
      throw error
    }
    const last = new Map<string, IntentRecord | undefined>()
    for (const entry of readJournal(text)) {
      if ('set' in entry) last.set(entry.set.id, entry.set)
      else last.set(entry.del, undefined)
    }
    for (const [id, record] of last) {
      if (!record) continue // deleted: nothing to restore
      const file = fileOf(id)
      const current = await peekLatest(file, id)
      if (!current || isNewer(record, current)) {
        await removeIfPresent(laterOf(file))
        await write(file, JSON.stringify(record), true)
      } else {
        await syncPath(file).catch((error) => {
          if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error
        })
      }
    }
    await syncDir()
    await unlink(path).catch(() => {})
  }

  // Replays every journal whose store is gone: its process no longer runs, or it was written before a reboot.
  const recoverJournals = async () => {
    let names: string[]
    try {
      names = await readdir(journalDir)
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return
      throw error
    }
    const boot = bootTime()
    for (const name of names) {
      const match = /^(\d+)\.(\d+)\.[0-9a-f]+\.log(\.replaying)?$/.exec(name)
      if (!match || join(journalDir, name) === journal?.path) continue
      const sameBoot = Math.abs(Number(match[1]) - boot) < SAME_BOOT_MS
      // A journal whose replay was cut short (its replayer died) is replayed again: replaying is idempotent.
      if (!match[3] && sameBoot && isAlive(Number(match[2]))) continue
      await replay(name)
    }
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

  // A lock file per intent naming its holder; stale when its process is gone or its lease ran out. Best effort
  // across processes (two takers of one stale lock can race); the server's key check remains the guarantee.
  const lockOf = (id: string) => fileOf(id).replace(/\.json$/, '.lock')
  // A lock file is written after it is created, so a holder killed in between leaves it empty or torn. Such a file
  // may also belong to a live holder that is still writing it: it counts as held until it is older than the lease.
  const readHolder = async (
    lock: string,
  ): Promise<{ pid: number; until: number } | 'unreadable' | undefined> => {
    let text: string
    try {
      text = await readFile(lock, 'utf8')
    } catch {
      return undefined
    }
    try {
      const holder = JSON.parse(text) as { pid?: unknown; until?: unknown }
      if (typeof holder.pid === 'number' && typeof holder.until === 'number') {
        return { pid: holder.pid, until: holder.until }
      }
    } catch {}
    const modified = await stat(lock).then(
      (stats) => stats.mtimeMs,
      () => 0,
    )
    return Date.now() - modified < leaseMs ? 'unreadable' : undefined
  }

  const takeLock = async (lock: string): Promise<boolean> => {
    const body = () => JSON.stringify({ pid: process.pid, until: Date.now() + leaseMs })
    try {
      const handle = await open(lock, 'wx')
      await handle.writeFile(body())
      await handle.close()
      return true
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw toStorageError(error)
    }
    const holder = await readHolder(lock)
    if (holder === 'unreadable') return false
    if (holder && holder.until > Date.now() && isAlive(holder.pid)) return false
    await unlink(lock).catch(() => {})
    return takeLock(lock)
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
      // The journal line is what survives a crash; the file is what every process reads. A stale later version
      // must not shadow this one (after a crash, the journal's replay removes it again).
      const journaled = append({ set: record }, true)
      const written = (async () => {
        await removeIfPresent(laterOf(file))
        await write(file, JSON.stringify(record), false)
      })()
      const [inJournal, inFile] = await Promise.allSettled([journaled, written])
      if (inJournal.status === 'rejected' || inFile.status === 'rejected') {
        // The caller is told nothing was recorded, so leave nothing that a resume() or a replay could send.
        await removeIfPresent(file).catch(() => {})
        if (inJournal.status === 'fulfilled') await append({ del: record.id }, false).catch(() => {})
        throw toStorageError(
          inJournal.status === 'rejected' ? inJournal.reason : (inFile as PromiseRejectedResult).reason,
        )
      }
    },
    async delete(id, options) {
      await ensureDir()
      const file = fileOf(id)
      await removeIfPresent(laterOf(file))
      await removeIfPresent(file)
      // Unflushed: it only spares a replay after a crash from restoring the intent (a resend the server replays).
      await append({ del: id }, false).catch((error) => {
        throw toStorageError(error)
      })
      if (options?.durable !== false) {
        await syncDir().catch((error) => {
          throw toStorageError(error)
        })
      }
    },
    async list() {
      await ensureDir()
      await recoverJournals().catch((error) => {
        throw toStorageError(error)
      })
      const names = (await readdir(dir)).filter((name) => name.endsWith('.json'))
      const records = await Promise.all(names.map((name) => readLatest(join(dir, name))))
      return records.filter((record): record is IntentRecord => record !== undefined)
    },
    async exclusive<T>(id: string, fn: () => Promise<T>): Promise<ExclusiveResult<T>> {
      await ensureDir()
      const lock = lockOf(id)
      if (!(await takeLock(lock))) return { acquired: false }
      const renew = setInterval(() => {
        void write(lock, JSON.stringify({ pid: process.pid, until: Date.now() + leaseMs }), false).catch(
          () => {},
        )
      }, leaseMs / 3)
      renew.unref()
      try {
        return { acquired: true, value: await fn() }
      } finally {
        clearInterval(renew)
        await unlink(lock).catch(() => {})
      }
    },
    /** Flushes the live intents' files, then removes this store's journal (they no longer need it). */
    async close() {
      const closing = queue.then(async () => {
        const current = journal
        if (!current) return
        journal = undefined
        for (const id of live.keys()) {
          await syncPath(fileOf(id)).catch((error) => {
            if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error
          })
        }
        await syncDir()
        live.clear()
        await current.handle.close()
        await unlink(current.path).catch(() => {})
      })
      queue = closing.catch(() => {})
      await closing.catch((error) => {
        throw toStorageError(error)
      })
    },
  }
}

type JournalEntry = { set: IntentRecord } | { del: string }

// One journal line: a checksum of the JSON, a space, the JSON (which never holds a raw newline), a newline.
function journalLine(entry: JournalEntry): string {
  const json = JSON.stringify(entry)
  return `${checksum(json)} ${json}\n`
}

function checksum(json: string): string {
  return createHash('sha256').update(json).digest('hex').slice(0, 16)
}

// The whole entries of a journal, in order. A line without its newline or with a wrong checksum is torn (a crash
// or a full disk landed in its write) and skipped; nothing is appended after a torn line (see `append`).
function readJournal(text: string): JournalEntry[] {
  const entries: JournalEntry[] = []
  let start = 0
  for (let end = text.indexOf('\n'); end >= 0; end = text.indexOf('\n', start)) {
    const line = text.slice(start, end)
    start = end + 1
    const json = line.slice(17)
    if (line[16] !== ' ' || checksum(json) !== line.slice(0, 16)) continue
    let entry: unknown
    try {
      entry = JSON.parse(json)
    } catch {
      continue
    }
    const e = entry as { set?: unknown; del?: unknown }
    if (isIntentRecord(e.set)) entries.push({ set: e.set })
    else if (typeof e.del === 'string') entries.push({ del: e.del })
  }
  return entries
}

async function writeAll(handle: FileHandle, text: string): Promise<void> {
  const buffer = Buffer.from(text)
  let offset = 0
  while (offset < buffer.length) {
    const { bytesWritten } = await handle.write(buffer, offset, buffer.length - offset)
    offset += bytesWritten
  }
}

async function exists(file: string): Promise<boolean> {
  try {
    await stat(file)
    return true
  } catch {
    return false
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
