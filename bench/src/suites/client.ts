// Client cost of write-ahead persistence: the same POST sent one at a time with plain ky (a key header, nothing
// persisted) and with the oncely client on each Node store. The local server answers 201 at once without a
// database, so the difference is the client's own work: minting the key, writing the intent before sending,
// and recording the outcome. Rounds alternate the order; the added p50/p99 is the median over rounds of the
// difference to ky in the same round.
import { randomUUID } from 'node:crypto'
import { mkdtemp, rm } from 'node:fs/promises'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { performance } from 'node:perf_hooks'
import { createClient, type IntentStore, memoryStore, type OncelyClient } from '@oncely/client'
import { fileStore } from '@oncely/client/node'
import ky from 'ky'
import { median, percentile } from '../stats.js'

export interface ClientSummary {
  /** `ky` (Node) and `fetch` (Chromium) are the baselines: a key header, nothing persisted. */
  store: 'ky' | 'memoryStore' | 'fileStore' | 'fetch' | 'indexedDbStore relaxed' | 'indexedDbStore strict'
  runtime: 'node' | 'chromium'
  p50Ms: number
  p99Ms: number
  /** Median over rounds of this store's p50 minus the baseline's p50 in the same round. 0 for the baseline. */
  addedP50Ms: number
  addedP99Ms: number
}

type Send = () => Promise<unknown>

/** Medians over rounds of each sender's p50/p99, and of its difference to `baseline` in the same round. */
export function summarize(
  rounds: readonly Record<string, number[]>[],
  names: readonly ClientSummary['store'][],
  baseline: ClientSummary['store'],
  runtime: ClientSummary['runtime'],
): ClientSummary[] {
  const at = (r: Record<string, number[]>, name: string, p: number) => percentile(r[name]!, p)
  return names.map((name) => ({
    store: name,
    runtime,
    p50Ms: median(rounds.map((r) => at(r, name, 50))),
    p99Ms: median(rounds.map((r) => at(r, name, 99))),
    addedP50Ms: median(rounds.map((r) => at(r, name, 50) - at(r, baseline, 50))),
    addedP99Ms: median(rounds.map((r) => at(r, name, 99) - at(r, baseline, 99))),
  }))
}

async function listen(): Promise<{ server: Server; url: string }> {
  const server = createServer((request, response) => {
    request.resume()
    request.on('end', () => {
      response.writeHead(201, { 'content-type': 'application/json' })
      response.end('{"id":"1","account":"acct-42","amount":1250}')
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }
}

async function timed(send: Send, count: number): Promise<number[]> {
  const latencies: number[] = []
  for (let i = 0; i < count; i++) {
    const start = performance.now()
    await send()
    latencies.push(performance.now() - start)
  }
  return latencies
}

export async function clientBench(options: {
  rounds: number
  requestsPerRound: number
  log: (line: string) => void
}): Promise<ClientSummary[]> {
  const { server, url } = await listen()
  const dir = await mkdtemp(path.join(os.tmpdir(), 'oncely-bench-client-'))
  const body = { account: 'acct-42', amount: 1250 }
  const clients: OncelyClient[] = []
  const oncely = (store: IntentStore): Send => {
    const client = createClient({ baseUrl: url, store, resumeOnStart: false, resumeOnOnline: false })
    clients.push(client)
    return () => client.request({ path: '/ledger', json: body })
  }
  const senders: Record<'ky' | 'memoryStore' | 'fileStore', Send> = {
    ky: () =>
      ky.post(`${url}/ledger`, { json: body, headers: { 'idempotency-key': randomUUID() }, retry: 0 }).json(),
    memoryStore: oncely(memoryStore()),
    fileStore: oncely(fileStore({ dir })),
  }
  const names = Object.keys(senders) as (keyof typeof senders)[]
  try {
    for (const name of names) await timed(senders[name], Math.min(200, options.requestsPerRound))
    const rounds: Record<string, number[]>[] = []
    for (let round = 0; round < options.rounds; round++) {
      const result: Record<string, number[]> = {}
      for (let i = 0; i < names.length; i++) {
        const name = names[(i + round) % names.length]!
        result[name] = await timed(senders[name], options.requestsPerRound)
      }
      rounds.push(result)
      options.log(
        `  client round ${round + 1}: ${names.map((n) => `${n} p50 ${percentile(result[n]!, 50).toFixed(3)} ms`).join(', ')}`,
      )
    }
    return summarize(rounds, names, 'ky', 'node')
  } finally {
    for (const client of clients) await client.close()
    server.close()
    await rm(dir, { recursive: true, force: true })
  }
}
