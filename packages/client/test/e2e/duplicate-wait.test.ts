// A duplicate of a long request, against the real server (@oncely/server on Postgres): while the first request
// holds its key, the server answers the duplicate 409 request_in_progress with a Retry-After, and the duplicate,
// with default retry options, keeps asking until the first one's answer exists.
import { afterAll, beforeAll, expect, it } from 'vitest'
import { createClient, memoryStore } from '../../src/index.js'
import { startOncelyServer } from '../support/oncely-server.js'

let server: Awaited<ReturnType<typeof startOncelyServer>>

beforeAll(async () => {
  server = await startOncelyServer('client_duplicate_wait')
})
afterAll(async () => {
  await server?.close()
})

it('a duplicate of a 12 s request ends with the original’s answer, with default options', async () => {
  server.workMs = 12_000
  // Two devices paying for the same cart: the same intentId derives the same key.
  const first = createClient({ baseUrl: server.url, store: memoryStore(), resumeOnOnline: false })
  const second = createClient({ baseUrl: server.url, store: memoryStore(), resumeOnOnline: false })
  const conflicts: number[] = []
  second.on('retry', (event) => {
    if (event.reason === 'status 409') conflicts.push(event.delayMs)
  })
  const pay = (client: typeof first) =>
    client.request<{ id: string }>({ path: '/v1/payments', json: { amount: 12 }, intentId: 'cart:long' })

  const original = pay(first)
  // The duplicate starts once the original reached the handler (the engine then holds its key for 12 s).
  const deadline = Date.now() + 20_000
  while (server.handled === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20))
  const duplicate = pay(second)

  const [a, b] = await Promise.all([original, duplicate])
  expect(a).toMatchObject({ status: 201, source: 'network' })
  expect(b).toMatchObject({ status: 201, source: 'replay', key: a.key, data: a.data })
  expect(conflicts.length).toBeGreaterThan(0) // it did wait as in progress
  expect(await server.effects()).toBe(1)
  await first.close()
  await second.close()
}, 60_000)
