import { spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdir, mkdtemp, open, readdir, readFile, rm, writeFile } from 'node:fs/promises'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir, uptime } from 'node:os'
import { join } from 'node:path'
import { afterAll, afterEach, beforeAll, expect, it, vi } from 'vitest'
import { createClient, type IntentRecord, type StoreEvents } from '../src/index.js'
import { fileStore } from '../src/stores/node.js'

// Pins which fileStore writes flush to disk: only the write-ahead record (one fdatasync of the store's journal)
// and a discard. Every flush goes through FileHandle#sync or #datasync, whose prototype is shared by all handles,
// so spies on them count them all.
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
  const proto = Object.getPrototypeOf(probe) as { sync(): Promise<void>; datasync(): Promise<void> }
  const sync = vi.spyOn(proto, 'sync')
  const datasync = vi.spyOn(proto, 'datasync')
  await probe.close()
  await rm(join(dir, 'probe'))
  return { dir, sync, datasync }
}

// Files of intents (and their later versions), leaving out locks and the journal directory.
const intentFiles = async (dir: string) =>
  (await readdir(dir)).filter((name) => !name.endsWith('.lock') && name !== 'journal')

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

it('flushes only the write-ahead record of a mutation: one fdatasync of the existing journal, none after', async () => {
  const { dir, sync, datasync } = await setup()
  const client = createClient({ baseUrl, store: fileStore({ dir }), resumeOnOnline: false })
  await client.request({ path: '/pay', json: { amount: 1 } }) // creates the journal (file and directory flushed)
  expect(sync).toHaveBeenCalledTimes(2)
  expect(datasync).toHaveBeenCalledTimes(1)
  sync.mockClear()
  datasync.mockClear()
  await client.request({ path: '/pay', json: { amount: 1 } }) // one-off: write-ahead, then delete
  expect(sync).toHaveBeenCalledTimes(0)
  expect(datasync).toHaveBeenCalledTimes(1)
  await client.request({ path: '/pay', json: { amount: 1 }, intentId: 'order:1' }) // named: settled outcome kept
  expect(sync).toHaveBeenCalledTimes(0)
  expect(datasync).toHaveBeenCalledTimes(2)
  sync.mockClear()
  datasync.mockClear()
  await client.discard('order:1') // the user's decision to forget an intent must survive a crash
  expect(sync).toHaveBeenCalledTimes(1)
  expect(datasync).toHaveBeenCalledTimes(0)
  expect(await client.pending()).toEqual([])
  expect(await intentFiles(dir)).toEqual([])
  await client.close() // nothing live: the journal goes
  expect(await readdir(join(dir, 'journal'))).toEqual([])
})

it('reads the newer unflushed version, and falls back to the write-ahead one when that is torn or stale', async () => {
  const { dir, sync, datasync } = await setup()
  const store = fileStore({ dir })
  await store.set(record())
  await store.set(record({ attempts: 1, version: 2 }), { durable: false })
  expect(sync).toHaveBeenCalledTimes(2) // creating the journal: its file and its directory
  expect(datasync).toHaveBeenCalledTimes(1) // the write-ahead record
  expect(await store.get('i1')).toEqual(record({ attempts: 1, version: 2 }))
  expect(await store.list()).toEqual([record({ attempts: 1, version: 2 })])

  const [later] = (await readdir(dir)).filter((name) => name.endsWith('.later'))
  await writeFile(join(dir, later!), '{"format":1,"id":"i1"') // torn by a crash on a file system without ordering
  expect(await store.get('i1')).toEqual(record())
  expect(await store.list()).toEqual([record()])

  // A new write-ahead record (same id, later createdAt) is never shadowed by the previous intent's later version.
  await store.set(record({ attempts: 5, version: 9, state: 'settled' }), { durable: false })
  await store.set(record({ createdAt: 3 }))
  expect(await store.get('i1')).toEqual(record({ createdAt: 3 }))
  await store.delete('i1', { durable: false })
  expect(await store.get('i1')).toBeUndefined()
  expect(await intentFiles(dir)).toEqual([])
})

// A journal line as fileStore writes it: checksum, space, JSON, newline.
const line = (entry: { set: IntentRecord } | { del: string }) => {
  const json = JSON.stringify(entry)
  return `${createHash('sha256').update(json).digest('hex').slice(0, 16)} ${json}\n`
}
const bootTime = () => Math.round(Date.now() - uptime() * 1000)

it('replays the journal of a store whose process is gone: restores what a crash lost, ignores a torn last line', async () => {
  const { dir } = await setup()
  // An intent whose file survived with a newer version than its journal line: left as it is.
  const writer = fileStore({ dir })
  await writer.set(record({ id: 'kept', key: 'k-kept', attempts: 3, version: 4 }))
  const deadPid = spawnSync(process.execPath, ['-e', '0']).pid
  const torn = line({ set: record({ id: 'torn', key: 'k-torn' }) })
  await writeFile(
    join(dir, 'journal', `${bootTime()}.${deadPid}.abcdef.log`),
    line({ set: record({ id: 'lost', key: 'k-lost' }) }) + // its file never reached the disk
      line({ set: record({ id: 'gone', key: 'k-gone' }) }) +
      line({ del: 'gone' }) + // settled and deleted: not restored
      line({ set: record({ id: 'kept', key: 'k-kept' }) }) +
      torn.slice(0, torn.length / 2), // the crash landed in this write: never acknowledged, never sent
  )
  const store = fileStore({ dir })
  const quarantined: StoreEvents['quarantined'][] = []
  store.attach?.((event, payload) => {
    if (event === 'quarantined') quarantined.push(payload as StoreEvents['quarantined'])
  })
  const records = (await store.list()).sort((a, b) => a.id.localeCompare(b.id))
  expect(records).toEqual([
    record({ id: 'kept', key: 'k-kept', attempts: 3, version: 4 }),
    record({ id: 'lost', key: 'k-lost' }),
  ])
  expect(quarantined).toEqual([])
  // Only the live writer's journal remains; the replayed one is gone.
  expect(await readdir(join(dir, 'journal'))).toHaveLength(1)
  await writer.close?.()
  await store.close?.()
  expect(await readdir(join(dir, 'journal'))).toEqual([])
  expect((await fileStore({ dir }).list()).map((r) => r.id).sort()).toEqual(['kept', 'lost'])
})

it('replays a journal from before a reboot even when its process id now belongs to a running process', async () => {
  const { dir } = await setup()
  await mkdir(join(dir, 'journal'), { recursive: true })
  const name = `${bootTime() - 3_600_000}.${process.pid}.abcdef.log`
  await writeFile(join(dir, 'journal', name), line({ set: record() }))
  expect(await fileStore({ dir }).get('i1')).toEqual(record())
  expect(await readdir(join(dir, 'journal'))).toEqual([])
  // The journal of a running process of this boot is its own business.
  const live = `${bootTime()}.${process.pid}.abcdef.log`
  await writeFile(join(dir, 'journal', live), line({ set: record({ id: 'i2' }) }))
  expect((await fileStore({ dir }).list()).map((r) => r.id)).toEqual(['i1'])
  expect(await readdir(join(dir, 'journal'))).toEqual([live])
})

it('rotates its journal: live write-ahead records are carried over, deleted ones and tombstones dropped', async () => {
  const { dir } = await setup()
  const store = fileStore({ dir })
  await store.set(record({ id: 'a' }))
  await store.set(record({ id: 'b' }))
  await store.delete('b', { durable: false })
  // 2000 entries (a, b, its tombstone and 1997 more tombstones): the next append rotates first.
  for (let i = 0; i < 1997; i++) await store.delete(`never-${i}`, { durable: false })
  await store.set(record({ id: 'c' }))
  const journals = await readdir(join(dir, 'journal'))
  expect(journals).toHaveLength(1)
  const text = await readFile(join(dir, 'journal', journals[0]!), 'utf8')
  expect(text).toBe(line({ set: record({ id: 'a' }) }) + line({ set: record({ id: 'c' }) }))
  expect((await store.list()).map((r) => r.id).sort()).toEqual(['a', 'c'])
})

it('a write-ahead that fails leaves nothing a resume() or a replay could send', async () => {
  const { dir } = await setup()
  const store = fileStore({ dir })
  await store.set(record({ id: 'ok' }))
  // A directory where the intent's file goes: its rename fails after the journal line was flushed.
  const file = join(dir, `${createHash('sha256').update('bad').digest('hex').slice(0, 40)}.json`)
  await mkdir(file)
  await expect(store.set(record({ id: 'bad' }))).rejects.toThrow(/File store failed/)
  const [journal] = await readdir(join(dir, 'journal'))
  const text = await readFile(join(dir, 'journal', journal!), 'utf8')
  expect(text.endsWith(line({ del: 'bad' }))).toBe(true) // a replay of this journal restores 'ok' only
  await rm(file, { recursive: true })
  expect((await store.list()).map((r) => r.id)).toEqual(['ok'])
})

it('notices when another store took its journal for a dead one, and copies its live records to a new one', async () => {
  const { dir } = await setup()
  const store = fileStore({ dir })
  await store.set(record({ id: 'a' }))
  const [taken] = await readdir(join(dir, 'journal'))
  // What a replay does to it: rename, read, flush the files, remove.
  await rm(join(dir, 'journal', taken!))
  await store.set(record({ id: 'b' }))
  const journals = await readdir(join(dir, 'journal'))
  expect(journals).toHaveLength(1)
  expect(journals[0]).not.toBe(taken)
  expect(await readFile(join(dir, 'journal', journals[0]!), 'utf8')).toBe(
    line({ set: record({ id: 'a' }) }) + line({ set: record({ id: 'b' }) }),
  )
})
