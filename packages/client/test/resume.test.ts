import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { createClient, type IntentRecord, memoryStore } from '../src/index.js'

// A real local server that holds every request briefly and records how many were in flight at once.
let server: Server
let baseUrl: string
let inFlight = 0
let maxInFlight = 0
const arrivals: string[] = []
const failing = new Set<string>()
beforeAll(async () => {
  server = createServer((request, response) => {
    const key = String(request.headers['idempotency-key'])
    arrivals.push(key)
    inFlight++
    maxInFlight = Math.max(maxInFlight, inFlight)
    request.resume()
    setTimeout(() => {
      inFlight--
      const status = failing.has(key) ? 503 : 201
      response.writeHead(status, { 'content-type': 'application/json' })
      response.end('{}')
    }, 15)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(() => {
  server.close()
})

const pending = (n: number, createdAt: number): IntentRecord => ({
  format: 1,
  id: `i${n}`,
  key: `key-${n}`,
  method: 'POST',
  url: `${baseUrl}/pay`,
  headers: {},
  createdAt,
  expiresAt: Date.now() + 60_000,
  attempts: 0,
  version: 1,
  state: 'pending',
})

it('resumes at most resumeConcurrency intents at once, oldest first, and a failing one does not block the rest', async () => {
  const store = memoryStore()
  // Written in shuffled age order: intent n was created at time n.
  const ages = [7, 2, 11, 0, 5, 9, 1, 10, 3, 8, 6, 4]
  for (const n of ages) await store.set(pending(n, 1_000 + n))
  failing.add('key-0') // the oldest keeps answering 503 until its retries are spent
  const client = createClient({
    baseUrl,
    store,
    resumeOnOnline: false,
    resumeConcurrency: 3,
    retry: { limit: 3, minDelayMs: 5, maxDelayMs: 5 },
  })
  // Start order as the client sends them: the server's arrival order may interleave two sends a moment apart.
  const starts: string[] = []
  client.on('attempt', (event) => {
    if (event.attempt === 1) starts.push(event.key)
  })
  const outcomes = await client.resume()

  expect(maxInFlight).toBe(3)
  expect(arrivals.slice(0, 3).sort()).toEqual(['key-0', 'key-1', 'key-2'])
  expect(starts).toEqual(Array.from({ length: 12 }, (_, n) => `key-${n}`)) // every intent started in age order
  expect(arrivals.filter((key) => key === 'key-0')).toHaveLength(4)
  expect(outcomes).toHaveLength(12)
  expect(outcomes[0]).toMatchObject({ id: 'i0', outcome: 'failed' })
  expect(outcomes.slice(1).map((o) => [o.id, o.outcome])).toEqual(
    Array.from({ length: 11 }, (_, i) => [`i${i + 1}`, 'settled']),
  )
})

it('validates resumeConcurrency at construction', () => {
  for (const bad of [0, 1.5, -1, Number.NaN, '4']) {
    expect(() => createClient({ baseUrl: 'http://api.test', resumeConcurrency: bad as never })).toThrow(
      /`resumeConcurrency`/,
    )
  }
})
