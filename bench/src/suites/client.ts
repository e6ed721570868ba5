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
  store: 'ky' | 'memoryStore' | 'fileStore'
  p50Ms: number
  p99Ms: number
  /** Median over rounds of this store's p50 minus ky's p50 in the same round. 0 for ky itself. */
  addedP50Ms: number
  addedP99Ms: number
}

type Send = () => Promise<unknown>

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
  const senders: Record<ClientSummary['store'], Send> = {
    ky: () =>
      ky.post(`${url}/ledger`, { json: body, headers: { 'idempotency-key': randomUUID() }, retry: 0 }).json(),
    memoryStore: oncely(memoryStore()),
    fileStore: oncely(fileStore({ dir })),
  }
  const names = Object.keys(senders) as ClientSummary['store'][]
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
    return names.map((name) => ({
      store: name,
      p50Ms: median(rounds.map((r) => percentile(r[name]!, 50))),
      p99Ms: median(rounds.map((r) => percentile(r[name]!, 99))),
      addedP50Ms: median(rounds.map((r) => percentile(r[name]!, 50) - percentile(r.ky!, 50))),
      addedP99Ms: median(rounds.map((r) => percentile(r[name]!, 99) - percentile(r.ky!, 99))),
    }))
  } finally {
    for (const client of clients) await client.close()
    server.close()
    await rm(dir, { recursive: true, force: true })
  }
}
