import { createHash } from 'node:crypto'
import { open, readFile, stat, unlink } from 'node:fs/promises'
import type { Lapse } from '../claim.js'
import { errno, fsError, replaceFile } from './fs.js'
import { mayRun, type ProcessName, thisProcess } from './process.js'

/** What a lock file says: its holder process, until when its lease runs, and the claim's token. */
export interface LockHolder extends ProcessName {
  until: number
  token?: string
}

/** What {@link LockFiles.inspect} found: no lock, a lock still held, or a stale lock with the exact state judged. */
export type LockState = 'absent' | 'held' | { stale: string }

/**
 * Lock files shared by the processes using one directory: the claim on an intent (one driver at a time) and a
 * store's owner file (the claim a store holds for its life on the intents it creates).
 *
 * A lock file names its holder process and a lease end. It is held while its lease runs and its process may still
 * run (see {@link mayRun}: a pid reused by another process does not keep it held); otherwise it is stale and the
 * next taker replaces it, as a compare-and-swap, so exactly one of several concurrent takers wins. The holder
 * renews the lease; the server's key check stays the real guarantee, lock files keep two processes from driving
 * one intent at once.
 */
export class LockFiles {
  constructor(readonly leaseMs: number) {}

  /** The text of a lock held by this process until `until`, for the claim `token`. */
  async text(until: number, token: string): Promise<string> {
    return JSON.stringify({ ...(await thisProcess()), until, token } satisfies LockHolder)
  }

  /**
   * What a lock (or takeover marker) file says. A lock file is written after it is created, so a holder killed in
   * between leaves it empty or torn; such a file may also belong to a live holder still writing it, so it counts
   * as held until it is older than the lease.
   */
  async inspect(path: string): Promise<LockState> {
    let text: string
    try {
      text = await readFile(path, 'utf8')
    } catch (error) {
      if (errno(error) === 'ENOENT') return 'absent'
      throw fsError(error)
    }
    const holder = holderOf(text)
    if (holder) return holder.until > Date.now() && (await mayRun(holder)) ? 'held' : { stale: text }
    let stats: Awaited<ReturnType<typeof stat>>
    try {
      stats = await stat(path)
    } catch (error) {
      if (errno(error) === 'ENOENT') return 'absent'
      throw fsError(error)
    }
    if (Date.now() - stats.mtimeMs < this.leaseMs) return 'held'
    return { stale: `${text}\n${stats.ino}:${stats.mtimeMs}` }
  }

  /** Creates `path` with `text` unless it exists; a failed write removes it again. */
  async create(path: string, text: string): Promise<boolean> {
    let handle: Awaited<ReturnType<typeof open>>
    try {
      handle = await open(path, 'wx')
    } catch (error) {
      if (errno(error) === 'EEXIST') return false
      throw fsError(error)
    }
    try {
      await handle.writeFile(text)
      await handle.close()
    } catch (error) {
      await handle.close().catch(() => {})
      await unlink(path).catch(() => {})
      throw fsError(error)
    }
    return true
  }

  /** Takes the lock at `path`: creates it, or takes it over when it is stale. False when someone holds it. */
  async take(path: string, text: () => Promise<string>): Promise<boolean> {
    for (let attempt = 0; attempt < 3; attempt++) {
      if (await this.create(path, await text())) return true
      const seen = await this.inspect(path)
      if (seen === 'held') return false
      if (seen !== 'absent') return this.#takeOver(path, seen.stale, text)
    }
    return false
  }

  /**
   * Renews the lease of the claim `token` (its lock file must still name it) with `text`; returns the lapse when
   * the claim can no longer be vouched for.
   */
  async renew(path: string, token: string, text: () => Promise<string>): Promise<Lapse | undefined> {
    let current: string
    try {
      current = await readFile(path, 'utf8')
    } catch (error) {
      return { reason: 'its lock file could not be read', cause: error }
    }
    if (holderOf(current)?.token !== token) return { reason: 'its lock file was replaced' }
    try {
      await replaceFile(path, await text())
    } catch (error) {
      return { reason: 'its lease could not be renewed', cause: (error as Error).cause ?? error }
    }
    return undefined
  }

  // Replaces a stale lock file with this claim's, as a compare-and-swap. The takers of one stale state take turns
  // through a marker file named after it (created exclusively), and the one whose turn it is renames its lock over
  // the stale one only if the lock is still exactly what it judged stale. The lock path never goes missing, so no
  // one can create it meanwhile, and a taker whose judgment is out of date finds the lock changed and backs off.
  // A taker that died holding a marker leaves it stale; the next taker uses the next marker.
  async #takeOver(path: string, stale: string, text: () => Promise<string>): Promise<boolean> {
    const tag = createHash('sha256').update(stale).digest('hex').slice(0, 16)
    const marker = (generation: number) => `${path}.${tag}.${generation}.take`
    for (let generation = 0, tries = 0; tries < 8; tries++) {
      if (await this.create(marker(generation), await this.text(Date.now() + this.leaseMs, 'takeover'))) {
        try {
          const now = await this.inspect(path)
          if (typeof now !== 'object' || now.stale !== stale) return false
          await replaceFile(path, await text()) // a temp file renamed over the stale lock: one atomic step
          return true
        } finally {
          for (let previous = generation; previous >= 0; previous--) {
            await unlink(marker(previous)).catch(() => {})
          }
        }
      }
      const other = await this.inspect(marker(generation))
      if (other === 'held') return false // another process is taking this lock over right now
      if (other !== 'absent') generation++ // its taker died before finishing
    }
    return false
  }
}

// The holder a lock or marker file names, if it is whole.
function holderOf(text: string): LockHolder | undefined {
  try {
    const holder = JSON.parse(text) as Partial<LockHolder> | null
    if (typeof holder?.pid === 'number' && typeof holder.until === 'number') return holder as LockHolder
  } catch {}
  return undefined
}
