// A ky instance wrapped by oncely, in a real child process SIGKILLed after its intent was written ahead and after
// it was sent, against @oncely/server (Fastify) on a real Postgres: the program that runs next completes the
// intent with the same key and bytes, and the server has made exactly one payment under that key.
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { afterAll, beforeAll, beforeEach, expect, it } from 'vitest'
import { fileStore } from '../../src/stores/node.js'
import { startOncelyServer } from '../support/oncely-server.js'
import { runFixture, until } from './support/child.js'

const fixture = fileURLToPath(new URL('./fixtures/ky-pay.ts', import.meta.url))
let server: Awaited<ReturnType<typeof startOncelyServer>>
let dir: string

beforeAll(async () => {
  server = await startOncelyServer('client_ky_crash')
})
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'oncely-ky-'))
  server.keys.length = 0
  server.dropResponses = false
  return () => rm(dir, { recursive: true, force: true })
})
afterAll(async () => {
  await server?.close()
})

const child = (...args: string[]) => runFixture(fixture, args)

it('SIGKILLed after the write-ahead, before the first byte: the same ky call after the restart sends it once', async () => {
  const first = child('pay', server.url, dir, 'checkout:ky_1', 'after-write')
  expect((await first.exited).signal).toBe('SIGKILL')
  const [written] = first.lines
  expect(written).toMatchObject({ event: 'attempt', attempt: 1 })
  const key = written!.key as string
  expect(server.keys).toEqual([]) // nothing was sent
  expect(await fileStore({ dir }).list()).toMatchObject([
    {
      key,
      state: 'pending',
      method: 'POST',
      body: { encoding: 'utf8', data: '{"amount":4200,"currency":"eur"}' },
    },
  ])

  // The program runs again and makes the same call: the pending intent is driven with its key and stored bytes.
  const second = child('pay', server.url, dir, 'checkout:ky_1')
  expect((await second.exited).code).toBe(0)
  expect(second.lines.find((line) => line.event === 'paid')).toMatchObject({
    status: 201,
    data: { amount: 4200 },
    // The write-ahead counted the first attempt, which the kill kept from being sent: this is the second.
    intent: { intentId: 'checkout:ky_1', key, source: 'network', replayed: false, attempts: 2 },
  })
  expect(server.keys).toEqual([key])
  expect(await server.effectsFor(key)).toBe(1)
  expect(await fileStore({ dir }).list()).toMatchObject([{ key, state: 'settled' }]) // its outcome, for settledTtlMs
})

it('SIGKILLed after the send (the payment made, its answers lost): client.resume() completes it, one payment', async () => {
  // The engine commits every attempt's payment (or finds it committed) and the socket is then destroyed.
  server.dropResponses = true
  const first = child('pay', server.url, dir)
  await until(() => server.keys.length >= 3, 'three attempts whose answers were lost')
  first.proc.kill('SIGKILL')
  expect((await first.exited).signal).toBe('SIGKILL')
  const key = server.keys[0]!
  expect(new Set(server.keys)).toEqual(new Set([key]))
  expect(await server.effectsFor(key)).toBe(1)
  expect(await fileStore({ dir }).list()).toMatchObject([{ key, state: 'pending' }])

  server.dropResponses = false
  const second = child('resume', server.url, dir)
  expect((await second.exited).code).toBe(0)
  expect(second.lines.find((line) => line.event === 'resumed')).toMatchObject({
    outcomes: [
      { outcome: 'settled', key, response: { status: 201, replayed: true, data: { amount: 4200 } } },
    ],
  })
  expect(second.lines.find((line) => line.event === 'pending')).toEqual({ event: 'pending', pending: [] })
  expect(new Set(server.keys)).toEqual(new Set([key]))
  expect(await server.effectsFor(key)).toBe(1)
})
