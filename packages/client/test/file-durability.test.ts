import { spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdtemp, open, readdir, readFile, rm, truncate, writeFile } from 'node:fs/promises'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, afterEach, beforeAll, expect, it, vi } from 'vitest'
import { createClient, type IntentRecord, isQuotaExceededError, type StoreEvents } from '../src/index.js'
import { fileStore } from '../src/stores/node.js'

// What fileStore writes and flushes, read back from the real file system. Every flush goes through
// FileHandle#datasync or FileHandle#sync, whose prototype all handles share, so spies on them count them all.
let server: Server
let baseUrl: string
const dirs: string[] = []
beforeAll(async () => {
  server = createServer((request, response) => {
    request.resume()
    request.on('end', () => {
      response.writeHead(201, { 'content-type': 'application/json' })
      response.end('{"ok":true}')
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterEach(() => {
  vi.restoreAllMocks()
})
afterAll(async () => {
  server.close()
  for (const dir of dirs) await rm(dir, { recursive: true, force: true })
})

async function setup() {
  const dir = await mkdtemp(join(tmpdir(), 'oncely-durability-'))
  dirs.push(dir)
  const probe = await open(join(dir, 'probe'), 'w')
  const prototype = Object.getPrototypeOf(probe) as { sync(): Promise<void>; datasync(): Promise<void> }
  const sync = vi.spyOn(prototype, 'sync')
  const datasync = vi.spyOn(prototype, 'datasync')
  await probe.close()
  await rm(join(dir, 'probe'))
  return { dir, sync, datasync }
}

const fileOf = (dir: string, id: string) =>
  join(dir, `${createHash('sha256').update(id).digest('hex').slice(0, 40)}.json`)
const intentFiles = async (dir: string) => (await readdir(dir)).filter((name) => name.endsWith('.json'))

const record = (patch: Partial<IntentRecord> = {}): IntentRecord => ({
  format: 1,
  id: 'i1',
  key: 'key-i1',
  method: 'POST',
  url: 'http://api.test/v1/payments',
  headers: {},
  createdAt: 1,
  expiresAt: 2,
  attempts: 0,
  version: 1,
  state: 'pending',
  ...patch,
})

it('makes a mutation durable with one fdatasync of a file that already exists, and flushes nothing else', async () => {
  const { dir, sync, datasync } = await setup()
  const client = createClient({ baseUrl, store: fileStore({ dir }), resumeOnOnline: false })
  await client.request({ path: '/pay', json: { amount: 0 } }) // the first one prepares the store's first cells
  sync.mockClear()
  datasync.mockClear()
  for (let i = 1; i <= 16; i++) await client.request({ path: '/pay', json: { amount: i } })
  expect(datasync).toHaveBeenCalledTimes(16)
  // Sixteen cells per file: the next file was prepared meanwhile, off the path of any mutation (its own flush
  // and its directory's); no mutation created, renamed or removed a file.
  expect(sync).toHaveBeenCalledTimes(2)
  sync.mockClear()
  datasync.mockClear()
  await client.request({ path: '/pay', json: { amount: 1 }, intentId: 'order:1' }) // its outcome is kept
  expect(datasync).toHaveBeenCalledTimes(1)
  await client.close()
  sync.mockClear()
  const again = createClient({ baseUrl, store: fileStore({ dir }), resumeOnOnline: false })
  await again.discard('order:1') // the user's decision to forget an intent survives a power loss
  expect(sync).toHaveBeenCalledTimes(1)
  expect(await again.pending()).toEqual([])
  await again.close()
  // Cells files whose cells were all used and emptied are gone; free slots and owner files are removed on close.
  expect((await readdir(dir)).filter((name) => !name.endsWith('.cells'))).toEqual([])
  expect(await fileStore({ dir }).list()).toEqual([])
  expect(await readdir(dir)).toEqual([])
})

it('reads the last whole version of an intent: a torn, garbled or stale later version is never read', async () => {
  const { dir } = await setup()
  const store = fileStore({ dir })
  const written = record({ attempts: 1, version: 1 })
  await store.set(written)
  await store.set(record({ attempts: 2, version: 2 }), { durable: false })
  await store.set(record({ attempts: 3, version: 3 }), { durable: false })
  expect(await store.get('i1')).toEqual(record({ attempts: 3, version: 3 }))
  const file = fileOf(dir, 'i1')
  const bytes = await readFile(file)
  const thirdStart = bytes.indexOf('oncely1 ', bytes.indexOf('"version":2'))
  await truncate(file, thirdStart + 70) // the last version torn by a crash
  expect(await store.get('i1')).toEqual(record({ attempts: 2, version: 2 }))
  const handle = await open(file, 'r+')
  await handle.write(Buffer.from('X'), 0, 1, thirdStart - 5) // a bit flipped inside the second version
  await handle.close()
  expect(await store.get('i1')).toEqual(written)
  expect(await store.list()).toEqual([written])

  // A new write-ahead record is a new chain: versions of the previous intent left after it are not its own.
  const another = fileStore({ dir })
  await another.set(record({ createdAt: 3 }))
  expect(await another.get('i1')).toEqual(record({ createdAt: 3 }))
  await another.delete('i1', { durable: false })
  expect(await another.get('i1')).toBeUndefined()
  expect(await intentFiles(dir)).toEqual([])
  await store.close?.()
  await another.close?.()
})

it('never reuses a cell: a deleted intent leaves its cell empty, and a file of used, emptied cells is removed', async () => {
  const { dir } = await setup()
  const store = fileStore({ dir })
  const events: unknown[] = []
  store.attach?.((_event, payload) => events.push(payload))
  const cellsFiles = async () => (await readdir(dir)).filter((name) => name.endsWith('.cells')).sort()
  await store.create!(record({ id: 'a', key: 'a' }), async () => {
    expect(await intentFiles(dir)).toEqual([]) // a new intent gets no file of its own
    expect((await store.list()).map((r) => r.id)).toEqual(['a'])
    await store.delete('a', { durable: false })
    expect(await store.get('a')).toBeUndefined() // emptied in place: no record any more
  })
  const [first] = await cellsFiles()
  for (let i = 1; i < 16; i++) {
    await store.create!(record({ id: `b${i}`, key: `b${i}` }), async () => {
      await store.delete(`b${i}`, { durable: false })
    })
  }
  expect(await cellsFiles()).not.toContain(first) // all 16 cells used and emptied
  expect(await store.list()).toEqual([])
  expect(events).toEqual([])
  await store.close?.()
})

it('leaves no byte of a deleted intent in its cell: its body and versions are overwritten, not only unlinked', async () => {
  const { dir } = await setup()
  const client = createClient({ baseUrl, store: fileStore({ dir }), resumeOnOnline: false })
  await client.request({ path: '/pay', json: { card: 'secret-4242-4242' } })
  await client.request({ path: '/pay', json: { card: 'another-secret' } })
  for (const name of await readdir(dir)) {
    const bytes = await readFile(join(dir, name))
    expect(bytes.includes('secret'), name).toBe(false)
  }
  await client.close()
})

// Regression: a store listing another, live store's cells file removed it when no cell held a whole record and none
// was fresh, which is also what a cell looks like while its write-ahead is being written.
it("does not remove a live store's cells file while a write-ahead may be being written in it", async () => {
  const { dir } = await setup()
  const creator = fileStore({ dir })
  for (let i = 0; i < 15; i++) {
    await creator.create!(record({ id: `c${i}`, key: `c${i}` }), async () => {
      await creator.delete(`c${i}`, { durable: false })
    })
  }
  const [cells] = (await readdir(dir)).filter((name) => name.endsWith('.cells'))
  // The last cell as a write-ahead torn mid-write looks to a reader: the start of a header, no whole frame.
  const handle = await open(join(dir, cells!), 'r+')
  await handle.write(Buffer.from('oncely1 0000000'), 0, 15, 15 * 16 * 1024)
  await handle.close()
  expect(await fileStore({ dir }).list()).toEqual([])
  expect(await readdir(dir)).toContain(cells)
  await creator.close?.()
  expect(await fileStore({ dir }).list()).toEqual([]) // its store gone: nothing can be written there any more
  expect(await readdir(dir)).not.toContain(cells)
})

it('empties and removes a write-ahead record whose flush failed before rejecting: it never comes back', async () => {
  const { dir, datasync } = await setup()
  const store = fileStore({ dir })
  await store.set(record({ id: 'warm-up', key: 'warm-up' }))
  await store.delete('warm-up')
  datasync.mockImplementationOnce(async () => {
    throw Object.assign(new Error('ENOSPC: no space left on device, fdatasync'), { code: 'ENOSPC' })
  })
  const error = await store.set(record()).catch((reason: unknown) => reason)
  expect(isQuotaExceededError(error)).toBe(true)
  expect(await store.list()).toEqual([])
  // Nothing left anywhere that a later recovery could bring back: every file left is an empty slot or the owner's.
  for (const name of await readdir(dir)) {
    expect((await readFile(join(dir, name))).includes('key-i1')).toBe(false)
  }
  await store.close?.()
  expect(await fileStore({ dir }).list()).toEqual([])
})

it('puts a record left in the slot of a store that died between flushing and renaming it in its place', async () => {
  const { dir } = await setup()
  const writer = fileStore({ dir })
  await writer.set(record({ id: 'x', key: 'x' }))
  const [written] = await intentFiles(dir)
  // As if its store died right after the fdatasync: the record is still under a slot name of a dead owner.
  const deadOwner = 'feedfacefeedface'
  await writeFile(join(dir, `${deadOwner}.7.slot`), await readFile(join(dir, written!)))
  await rm(join(dir, written!))
  const reader = fileStore({ dir })
  expect(await reader.get('x')).toBeUndefined() // not under its name yet
  expect((await reader.list()).map((r) => r.id)).toEqual(['x'])
  expect(await reader.get('x')).toMatchObject({ id: 'x' })
  expect((await readdir(dir)).filter((name) => name.startsWith(deadOwner))).toEqual([])
  // A live store's slots are its own: never touched by another store's list().
  const liveSlots = (await readdir(dir)).filter((name) => name.endsWith('.slot'))
  await reader.list()
  expect((await readdir(dir)).filter((name) => name.endsWith('.slot'))).toEqual(
    expect.arrayContaining(liveSlots),
  )
  await writer.close?.()
  await reader.close?.()
})

// fileStore reads only chains of records: a file of another format (such as a plain JSON record, which development
// versions before 0.1.0 wrote) is quarantined like any unreadable file, never read as an intent.
it('quarantines a file of its own that holds a plain JSON record instead of a chain, and never reads it', async () => {
  const { dir } = await setup()
  const file = fileOf(dir, 'old')
  await writeFile(file, JSON.stringify(record({ id: 'old', key: 'old' })))
  const store = fileStore({ dir })
  const events: StoreEvents['quarantined'][] = []
  store.attach?.((event, payload) => {
    if (event === 'quarantined') events.push(payload as StoreEvents['quarantined'])
  })
  expect(await store.list()).toEqual([])
  expect(await store.get('old')).toBeUndefined()
  expect(events).toEqual([
    expect.objectContaining({ store: 'file', reason: expect.stringContaining('not a chain of records') }),
  ])
  expect(JSON.parse(await readFile(events[0]!.location, 'utf8'))).toEqual(record({ id: 'old', key: 'old' }))
  await store.close?.()
})

/** Polls `condition` every 10 ms until it holds (or fails the test after 10 s). */
async function until(condition: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 10_000
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error('timed out waiting for the condition')
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

it('lets another store drive an intent only once its creator let go of it or is gone', async () => {
  const { dir } = await setup()
  const creator = fileStore({ dir })
  const other = fileStore({ dir })
  let release!: () => void
  const driving = creator.create!(
    record(),
    () =>
      new Promise<void>((resolve) => {
        release = resolve
      }),
  )
  // As resume() does, before driving it: list, once the creator's write-ahead is there (no fixed sleep: a loaded
  // machine may take longer than any).
  await until(async () => (await other.list()).length === 1)
  expect((await other.list()).map((r) => r.id)).toEqual(['i1'])
  expect(await other.exclusive!('i1', async () => 'other')).toEqual({ acquired: false })
  release()
  await driving
  // Its run ended with the intent pending: a version naming no owner lets any store drive it.
  expect(await other.exclusive!('i1', async () => 'other')).toEqual({ acquired: true, value: 'other' })

  await creator.close?.()

  // An owner file naming a process that is gone, as a SIGKILLed process leaves it.
  const third = fileStore({ dir })
  let releaseThird!: () => void
  const held = third.create!(
    record({ id: 'i2', key: 'k2' }),
    () =>
      new Promise<void>((resolve) => {
        releaseThird = resolve
      }),
  )
  await until(async () => (await other.list()).some((r) => r.id === 'i2'))
  expect(await other.exclusive!('i2', async () => 'other')).toEqual({ acquired: false })
  const [ownerFile] = (await readdir(dir)).filter((name) => name.endsWith('.owner'))
  const holder = JSON.parse(await readFile(join(dir, ownerFile!), 'utf8')) as Record<string, unknown>
  const dead = spawnSync(process.execPath, ['-e', '0']).pid
  await writeFile(join(dir, ownerFile!), JSON.stringify({ ...holder, pid: dead, start: '1' }))
  expect(await other.exclusive!('i2', async () => 'other')).toEqual({ acquired: true, value: 'other' })
  releaseThird()
  await held
  await third.close?.()
  await other.close?.()
})
