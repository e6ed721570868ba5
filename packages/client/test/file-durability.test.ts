import { mkdtemp, open, readdir, rm, writeFile } from 'node:fs/promises'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, afterEach, beforeAll, expect, it, vi } from 'vitest'
import { createClient, type IntentRecord } from '../src/index.js'
import { fileStore } from '../src/stores/node.js'

// Pins which fileStore writes flush to disk: only the write-ahead record (file + directory) and a discard. Every
// fsync goes through FileHandle#sync, whose prototype is shared by all handles, so a spy on it counts them all.
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
  const sync = vi.spyOn(Object.getPrototypeOf(probe) as { sync(): Promise<void> }, 'sync')
  await probe.close()
  await rm(join(dir, 'probe'))
  return { dir, sync }
}

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

it('flushes only the write-ahead record of a mutation: two fsyncs (file and directory), none after', async () => {
  const { dir, sync } = await setup()
  const client = createClient({ baseUrl, store: fileStore({ dir }), resumeOnOnline: false })
  await client.request({ path: '/pay', json: { amount: 1 } }) // one-off: attempt write, then delete
  expect(sync).toHaveBeenCalledTimes(2)
  await client.request({ path: '/pay', json: { amount: 1 }, intentId: 'order:1' }) // named: settled outcome kept
  expect(sync).toHaveBeenCalledTimes(4)
  sync.mockClear()
  await client.discard('order:1') // the user's decision to forget an intent must survive a crash
  expect(sync).toHaveBeenCalledTimes(1)
  expect(await client.pending()).toEqual([])
  expect((await readdir(dir)).filter((name) => !name.endsWith('.lock'))).toEqual([])
})

it('reads the newer unflushed version, and falls back to the write-ahead one when that is torn or stale', async () => {
  const { dir, sync } = await setup()
  const store = fileStore({ dir })
  await store.set(record())
  await store.set(record({ attempts: 1, version: 2 }), { durable: false })
  expect(sync).toHaveBeenCalledTimes(2)
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
  expect(await readdir(dir)).toEqual([])
})
