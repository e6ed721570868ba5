import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { fileStore } from '../../src/stores/node.js'
import { startOncelyServer } from '../support/oncely-server.js'
import { runFixture, until } from './support/child.js'

const fixture = fileURLToPath(new URL('./fixtures/pay.ts', import.meta.url))
let server: Awaited<ReturnType<typeof startOncelyServer>>
let dir: string

beforeAll(async () => {
  server = await startOncelyServer('client_kill_resume')
  dir = await mkdtemp(join(tmpdir(), 'oncely-kill-'))
})
afterAll(async () => {
  await server?.close()
  await rm(dir, { recursive: true, force: true })
})

const child = (mode: 'pay' | 'resume') => runFixture(fixture, [mode, server.url, dir])

it('a process SIGKILLed while responses are dropped leaves an intent that a second process completes once', async () => {
  // @oncely/server on Postgres commits every attempt (or finds the committed one) and the socket is then destroyed.
  server.dropResponses = true
  const first = child('pay')
  await until(() => server.keys.length >= 3, 'three dropped attempts')
  first.proc.kill('SIGKILL')
  expect((await first.exited).signal).toBe('SIGKILL')
  const key = server.keys[0]!
  expect(new Set(server.keys)).toEqual(new Set([key]))
  expect(await server.effects()).toBe(1)
  expect(await fileStore({ dir }).list()).toMatchObject([{ key, state: 'pending' }])

  server.dropResponses = false
  const second = child('resume')
  expect((await second.exited).code).toBe(0)
  const resumed = second.lines.find((line) => line.event === 'resumed') as {
    outcomes: {
      outcome: string
      key: string
      response: { status: number; replayed: boolean; data: unknown }
    }[]
  }
  expect(resumed.outcomes).toEqual([
    expect.objectContaining({
      outcome: 'settled',
      key,
      response: expect.objectContaining({ status: 201, replayed: true }),
    }),
  ])
  expect(resumed.outcomes[0]!.response.data).toMatchObject({ amount: 4200 })
  expect(second.lines.find((line) => line.event === 'pending')).toEqual({ event: 'pending', pending: [] })
  expect(new Set(server.keys)).toEqual(new Set([key]))
  expect(await server.effects()).toBe(1)
})
