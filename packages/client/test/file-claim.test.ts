import { spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import * as fs from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, afterEach, beforeEach, expect, it, vi } from 'vitest'
import { type IntentStore, StorageError, type StoreEvents } from '../src/index.js'
import { fileStore } from '../src/stores/node.js'

// The claim races of fileStore (lock renewal, release, takeover), made deterministic: every fs call of the store
// goes through `hooks`, which a test uses to hold one call until it has driven the others to the point it wants.
type Fs = typeof import('node:fs/promises')
const hooks = vi.hoisted(() => ({
  rename: undefined as ((from: string, to: string) => Promise<void> | void) | undefined,
  renamed: undefined as ((from: string, to: string) => void) | undefined,
  unlink: undefined as ((path: string, done: Promise<void>) => void) | undefined,
  readFile: undefined as ((path: string, text: string) => Promise<void> | void) | undefined,
  readdir: undefined as ((path: string) => Promise<void> | void) | undefined,
}))
vi.mock('node:fs/promises', async (importOriginal) => {
  const actual = await importOriginal<Fs>()
  return {
    ...actual,
    rename: async (from: string, to: string) => {
      await hooks.rename?.(from, to)
      await actual.rename(from, to)
      hooks.renamed?.(from, to)
    },
    unlink: (path: string) => {
      const done = actual.unlink(path)
      hooks.unlink?.(path, done)
      return done
    },
    readFile: async (path: string, encoding: BufferEncoding) => {
      const text = await actual.readFile(path, encoding)
      await hooks.readFile?.(path, text)
      return text
    },
    readdir: async (path: string) => {
      await hooks.readdir?.(path)
      return actual.readdir(path)
    },
  }
})

const dirs: string[] = []
afterAll(async () => {
  for (const dir of dirs) await fs.rm(dir, { recursive: true, force: true })
})
beforeEach(() => {
  vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] })
})
afterEach(() => {
  vi.useRealTimers()
  hooks.rename = hooks.renamed = hooks.unlink = hooks.readFile = hooks.readdir = undefined
})

async function tempDir() {
  const dir = await fs.mkdtemp(join(tmpdir(), 'oncely-claim-'))
  dirs.push(dir)
  return dir
}
const lockOf = (dir: string, id: string) =>
  join(dir, `${createHash('sha256').update(id).digest('hex').slice(0, 40)}.lock`)
const exists = (path: string) =>
  fs.stat(path).then(
    () => true,
    () => false,
  )

// The claim-lost events `store` reports, as they come.
function claimsLost(store: IntentStore): StoreEvents['claim-lost'][] {
  const events: StoreEvents['claim-lost'][] = []
  store.attach?.((event, payload) => {
    if (event === 'claim-lost') events.push(payload as StoreEvents['claim-lost'])
  })
  return events
}

// A section that runs until released; `started` resolves once it runs.
function pausedSection() {
  const started = deferred()
  const release = deferred()
  return {
    started: started.promise,
    release: release.resolve,
    run: async () => {
      started.resolve()
      await release.promise
      return 'done'
    },
  }
}

function deferred<T = void>() {
  let resolve!: (value: T) => void
  const promise = new Promise<T>((done) => (resolve = done))
  return { promise, resolve }
}

// Regression: a failed renewal (ENOSPC, EACCES, ...) was swallowed, so a driver whose lease had silently run out
// kept going while another process took the intent over.
it('fails the exclusive section with a StorageError when a lease renewal fails', async () => {
  const dir = await tempDir()
  const leaseMs = 3_000
  const store = fileStore({ dir, leaseMs })
  const lock = lockOf(dir, 'i1')
  const section = pausedSection()
  const held = store.exclusive!('i1', section.run)
  await section.started
  hooks.rename = (_from, to) => {
    if (to === lock) throw Object.assign(new Error('EACCES: permission denied'), { code: 'EACCES' })
  }
  vi.advanceTimersByTime(leaseMs / 3) // the renewal starts now and fails
  section.release()
  const error = await held.then(
    () => undefined,
    (reason: unknown) => reason,
  )
  expect(error).toBeInstanceOf(StorageError)
  expect((error as Error).message).toMatch(/claim on intent "i1"/)
  expect(((error as Error).cause as Error).message).toMatch(/EACCES/)
})

it('reports a lost claim as a claim-lost event as soon as it is noticed, before the section ends', async () => {
  const dir = await tempDir()
  const leaseMs = 3_000
  const store = fileStore({ dir, leaseMs })
  const events = claimsLost(store)
  const lock = lockOf(dir, 'i1')
  const section = pausedSection()
  const held = store.exclusive!('i1', section.run)
  held.catch(() => {})
  await section.started
  hooks.rename = (_from, to) => {
    if (to === lock) throw Object.assign(new Error('ENOSPC: no space left on device'), { code: 'ENOSPC' })
  }
  vi.advanceTimersByTime(leaseMs / 3) // the renewal starts now and fails
  await vi.waitFor(() => expect(events).toHaveLength(1))
  expect(events[0]).toMatchObject({ store: 'file', id: 'i1', reason: 'its lease could not be renewed' })
  expect(events[0]?.error).toBeInstanceOf(StorageError)
  vi.advanceTimersByTime(leaseMs / 3) // no second event for the same claim
  section.release()
  await expect(held).rejects.toBeInstanceOf(StorageError)
  expect(events).toHaveLength(1)
})

it('fails the exclusive section when another process replaced its lock in the meantime', async () => {
  const dir = await tempDir()
  const leaseMs = 3_000
  const store = fileStore({ dir, leaseMs })
  const lock = lockOf(dir, 'i1')
  const section = pausedSection()
  const held = store.exclusive!('i1', section.run)
  await section.started
  const other = JSON.stringify({ pid: process.pid, until: Date.now() + 60_000, token: 'someone-else' })
  await fs.writeFile(lock, other)
  vi.advanceTimersByTime(leaseMs / 3)
  section.release()
  await expect(held).rejects.toBeInstanceOf(StorageError)
  expect(await fs.readFile(lock, 'utf8')).toBe(other) // neither overwritten by the renewal nor released
})

// Regression: a renewal still writing when the claim was released recreated the lock file after the release had
// removed it, a ghost claim that kept every other process out until its lease ran out.
it('waits for a renewal in flight before releasing, so no ghost lock is left behind', async () => {
  const dir = await tempDir()
  const leaseMs = 3_000
  const store = fileStore({ dir, leaseMs })
  const lock = lockOf(dir, 'i1')
  const section = pausedSection()
  const held = store.exclusive!('i1', section.run)
  await section.started
  const renaming = deferred()
  const proceed = deferred()
  const landed = deferred()
  hooks.rename = async (_from, to) => {
    if (to !== lock) return
    renaming.resolve()
    await proceed.promise
  }
  hooks.renamed = (_from, to) => {
    if (to === lock) landed.resolve()
  }
  let unlinking: Promise<void> | undefined
  hooks.unlink = (path, done) => {
    if (path === lock) unlinking = done
  }
  vi.advanceTimersByTime(leaseMs / 3) // a renewal starts
  await renaming.promise // ... and is about to rename its new lock file into place
  section.release() // the driver finishes while the renewal is in flight
  // One macrotask runs every microtask the release queues: a release that removes the lock at once has now
  // started its unlink, which finishes before the renewal lands. A release that waits for the renewal has not.
  await new Promise((resolve) => setImmediate(resolve))
  await unlinking?.catch(() => {})
  proceed.resolve()
  expect(await held).toEqual({ acquired: true, value: 'done' })
  await landed.promise
  expect(await exists(lock)).toBe(false)
  expect(await fileStore({ dir, leaseMs }).exclusive!('i1', async () => 'next')).toEqual({
    acquired: true,
    value: 'next',
  })
})

// Regression: two processes taking over the same stale lock could both win: the second removed the first's fresh
// lock, believing it was still the stale one, and created its own.
it('lets only one of two concurrent takers of a stale lock win', async () => {
  const dir = await tempDir()
  const lock = lockOf(dir, 'i1')
  const deadPid = spawnSync(process.execPath, ['-e', '0']).pid
  await fs.writeFile(lock, JSON.stringify({ pid: deadPid, until: Date.now() + 60_000 }))
  const stale = await fs.readFile(lock, 'utf8')
  // Both takers read the stale lock before either acts; then the first takes over completely (its section
  // starts) before the second, still holding its judgment that the lock is stale, goes on.
  const judged: (() => void)[] = []
  const bothJudged = deferred()
  const firstRunning = deferred()
  hooks.readFile = async (path, text) => {
    if (path !== lock || text !== stale || judged.length >= 2) return
    const gate = deferred()
    judged.push(gate.resolve)
    if (judged.length === 2) bothJudged.resolve()
    await gate.promise
  }
  void bothJudged.promise.then(async () => {
    judged[0]!()
    await firstRunning.promise
    judged[1]!()
  })
  const ran: string[] = []
  const secondRan = deferred()
  const release = deferred()
  const section = (name: string) => async () => {
    ran.push(name)
    firstRunning.resolve()
    if (ran.length === 2) secondRan.resolve()
    await release.promise
    return name
  }
  const a = fileStore({ dir }).exclusive!('i1', section('a'))
  const b = fileStore({ dir }).exclusive!('i1', section('b'))
  // While the winner's section runs, the loser must answer { acquired: false } rather than run its own.
  const outcome = await Promise.race([
    Promise.race([a, b]).then((result) => result),
    secondRan.promise.then(() => 'both sections ran'),
  ])
  expect(outcome).toEqual({ acquired: false })
  expect(ran).toHaveLength(1)
  release.resolve()
  const outcomes = await Promise.all([a, b])
  expect(outcomes.filter((result) => result.acquired)).toHaveLength(1)
})

it('takes over a stale lock even when an earlier taker died halfway through its takeover', async () => {
  const dir = await tempDir()
  const lock = lockOf(dir, 'i1')
  const deadPid = spawnSync(process.execPath, ['-e', '0']).pid
  await fs.writeFile(lock, JSON.stringify({ pid: deadPid, until: Date.now() + 60_000 }))
  // The first taker stops for good just before renaming its lock into place, as if killed there ...
  const stuck = deferred()
  hooks.rename = async (_from, to) => {
    if (to !== lock) return
    hooks.rename = undefined
    stuck.resolve()
    await new Promise(() => {})
  }
  void fileStore({ dir }).exclusive!('i1', async () => 'never')
  await stuck.promise
  // ... so its takeover marker names a process that no longer exists.
  const markers = (await fs.readdir(dir)).filter((name) => name.endsWith('.take'))
  expect(markers).toHaveLength(1)
  await fs.writeFile(join(dir, markers[0]!), JSON.stringify({ pid: deadPid, until: Date.now() + 60_000 }))
  expect(await fileStore({ dir }).exclusive!('i1', async () => 'b')).toEqual({ acquired: true, value: 'b' })
  expect((await fs.readdir(dir)).filter((name) => name.endsWith('.take'))).toEqual([])
})

// Regression: list() let a raw readdir error (ENOTDIR, EACCES, ...) escape instead of the store's StorageError.
it('wraps a failing readdir in list() as a StorageError', async () => {
  const dir = await tempDir()
  const store = fileStore({ dir })
  expect(await store.list()).toEqual([])
  hooks.readdir = () => {
    throw Object.assign(new Error('EACCES: permission denied, scandir'), { code: 'EACCES' })
  }
  await expect(store.list()).rejects.toBeInstanceOf(StorageError)
})

it("loses the claim on an intent a store created when the store's owner file can no longer be renewed", async () => {
  const dir = await tempDir()
  const leaseMs = 3_000
  const store = fileStore({ dir, leaseMs })
  const events = claimsLost(store)
  const section = pausedSection()
  const record = {
    format: 1 as const,
    id: 'k1',
    key: 'k1',
    method: 'POST',
    url: 'http://api.test/pay',
    headers: {},
    createdAt: 1,
    expiresAt: Date.now() + 60_000,
    attempts: 1,
    version: 1,
    state: 'pending' as const,
  }
  const held = store.create!(record, section.run)
  held.catch(() => {})
  await section.started
  hooks.rename = (_from, to) => {
    if (to.endsWith('.owner'))
      throw Object.assign(new Error('EROFS: read-only file system'), { code: 'EROFS' })
  }
  vi.advanceTimersByTime(leaseMs / 3) // the owner file's renewal starts now and fails
  await vi.waitFor(() => expect(events).toHaveLength(1))
  expect(events[0]).toMatchObject({ store: 'file', id: 'k1' })
  expect(events[0]!.reason).toMatch(/owner file/)
  section.release()
  await expect(held).rejects.toBeInstanceOf(StorageError)
  hooks.rename = undefined
  await store.close?.()
})
