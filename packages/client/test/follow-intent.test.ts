// What a caller needs to follow one intent from outside the client (UI bindings, logging): its id and key before
// anything is sent (`onIntent`), and the outcome of every intent that resume() brought to an end (`resumed`).
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { type ClientEvents, createClient, type IntentRecord, isHTTPError, memoryStore } from '../src/index.js'

// A real local server: 201 with the body echoed, except 400 for { "amount": 0 }.
let server: Server
let baseUrl: string
const keys: string[] = []
beforeAll(async () => {
  server = createServer((request, response) => {
    keys.push(String(request.headers['idempotency-key']))
    let body = ''
    request.on('data', (chunk) => {
      body += chunk
    })
    request.on('end', () => {
      const amount = (JSON.parse(body || '{}') as { amount?: number }).amount
      response.writeHead(amount === 0 ? 400 : 201, { 'content-type': 'application/json' })
      response.end(JSON.stringify({ amount }))
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(() => {
  server.close()
})

it('onIntent gives the id and key before the write-ahead record and before any attempt', async () => {
  const store = memoryStore()
  const client = createClient({ baseUrl, store, resumeOnOnline: false })
  const order: string[] = []
  client.on('attempt', ({ id }) => order.push(`attempt ${id}`))
  let seen: { id: string; key: string; stored: boolean } | undefined
  const pay = client.mutation<{ amount: number }, { amount: number }>({ path: '/pay' })
  const response = await pay(
    { amount: 5 },
    {
      onIntent: (intent) => {
        order.push(`intent ${intent.id}`)
        seen = { ...intent, stored: false }
        void store.get(intent.id).then((record) => {
          if (seen) seen.stored = record !== undefined
        })
      },
    },
  )
  expect(seen).toMatchObject({ id: response.intentId, key: response.key, stored: false })
  expect(order).toEqual([`intent ${response.intentId}`, `attempt ${response.intentId}`])

  const named = await client.request({
    path: '/pay',
    json: { amount: 6 },
    intentId: 'cart:1',
    onIntent: (i) => order.push(`intent ${i.id} ${i.key}`),
  })
  expect(order.at(-2)).toBe(`intent cart:1 ${named.key}`)
})

it('emits resumed with the outcome, method and URL of each intent resume() settled or failed', async () => {
  const store = memoryStore()
  const record = (id: string, amount: number): IntentRecord => ({
    format: 1,
    id,
    key: `key-${id}`,
    method: 'POST',
    url: `${baseUrl}/pay`,
    body: { encoding: 'utf8', data: JSON.stringify({ amount }) },
    headers: { 'content-type': 'application/json' },
    createdAt: Date.now(),
    expiresAt: Date.now() + 60_000,
    attempts: 1,
    version: 1,
    state: 'pending',
  })
  await store.set(record('ok', 7))
  await store.set(record('declined', 0))
  const client = createClient({ baseUrl, store, resumeOnOnline: false })
  const resumed: ClientEvents['resumed'][] = []
  client.on('resumed', (event) => resumed.push(event))
  const outcomes = await client.resume()
  expect(outcomes).toHaveLength(2)
  const ok = resumed.find((event) => event.id === 'ok')
  const declined = resumed.find((event) => event.id === 'declined')
  expect(resumed).toHaveLength(2)
  expect(ok).toMatchObject({ key: 'key-ok', method: 'POST', url: `${baseUrl}/pay`, outcome: 'settled' })
  expect(ok?.outcome === 'settled' && ok.response.data).toEqual({ amount: 7 })
  expect(declined?.outcome === 'failed' && isHTTPError(declined.error) && declined.error.status).toBe(400)

  // A plain request settles without a resumed event.
  await client.request({ path: '/pay', json: { amount: 8 } })
  expect(resumed).toHaveLength(2)
})
