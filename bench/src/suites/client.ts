// Client cost of write-ahead persistence: the same POST sent one at a time with plain ky (a key header, nothing
// persisted) and with the oncely client on each Node store. The local server answers 201 at once without a
// database, so the difference is the client's own work: minting the key, writing the intent before sending,
// and recording the outcome. Rounds alternate the order; the added p50/p99 is the median over rounds of the
// difference to ky in the same round.
//
// The floor is what one durable write costs on the disk the store writes to, measured in the same rounds: an
// intent-sized record written over the start of an existing, already allocated file and made durable with one
// fdatasync (no file created, no directory flushed). No store can make a mutation durable for less.
import { randomUUID } from 'node:crypto'
import { type FileHandle, mkdtemp, open, rm } from 'node:fs/promises'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { performance } from 'node:perf_hooks'
import { createClient, type IntentStore, memoryStore, type OncelyClient } from '@oncely/client'
import { fileStore } from '@oncely/client/node'
import ky from 'ky'
import { LEDGER_BODY, ledgerIntent } from '../intent.js'
import { median, percentile } from '../stats.js'

/** A floor: the bare durable write a store's write-ahead is compared to, measured in the same rounds. */
export type ClientFloor = 'fdatasync' | 'IndexedDB put relaxed' | 'IndexedDB put strict'

export interface ClientSummary {
  /**
   * `ky` (Node) and `fetch` (Chromium) are the baselines: a key header, nothing persisted. `IndexedDB put strict,
   * then fetch` is a reference: the baseline preceded by a bare put, what a durable write costs a mutation at the
   * rhythm of mutations.
   */
  store:
    | 'ky'
    | 'memoryStore'
    | 'fileStore'
    | 'fetch'
    | 'indexedDbStore relaxed'
    | 'indexedDbStore strict'
    | 'IndexedDB put strict, then fetch'
  runtime: 'node' | 'chromium'
  p50Ms: number
  p99Ms: number
  /** Median over rounds of this store's p50 minus the baseline's p50 in the same round. 0 for the baseline. */
  addedP50Ms: number
  addedP99Ms: number
  /** The bare durable write this store is held to (median over rounds of its own p50), when it has one. */
  floor?: { name: ClientFloor; p50Ms: number; p99Ms: number }
}

/** Which floor each durable store is held to. */
export const FLOOR_OF: Partial<Record<ClientSummary['store'], ClientFloor>> = {
  fileStore: 'fdatasync',
  'indexedDbStore relaxed': 'IndexedDB put relaxed',
  'indexedDbStore strict': 'IndexedDB put strict',
}

type Send = () => Promise<unknown>

/**
 * Medians over rounds of each sender's p50/p99, of its difference to `baseline` in the same round, and of the p50
 * and p99 of its floor (a sender named in {@link FLOOR_OF} that was timed in the same rounds).
 */
export function summarize(
  rounds: readonly Record<string, number[]>[],
  names: readonly ClientSummary['store'][],
  baseline: ClientSummary['store'],
  runtime: ClientSummary['runtime'],
): ClientSummary[] {
  const at = (r: Record<string, number[]>, name: string, p: number) => percentile(r[name]!, p)
  return names.map((name) => {
    const floor = FLOOR_OF[name]
    return {
      store: name,
      runtime,
      p50Ms: median(rounds.map((r) => at(r, name, 50))),
      p99Ms: median(rounds.map((r) => at(r, name, 99))),
      addedP50Ms: median(rounds.map((r) => at(r, name, 50) - at(r, baseline, 50))),
      addedP99Ms: median(rounds.map((r) => at(r, name, 99) - at(r, baseline, 99))),
      ...(floor && rounds.every((r) => r[floor])
        ? {
            floor: {
              name: floor,
              p50Ms: median(rounds.map((r) => at(r, floor, 50))),
              p99Ms: median(rounds.map((r) => at(r, floor, 99))),
            },
          }
        : {}),
    }
  })
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

// The fdatasync floor's file: allocated and flushed once, so every timed write only overwrites data in place.
async function floorFile(dir: string, size: number): Promise<FileHandle> {
  const handle = await open(path.join(dir, 'floor'), 'w+')
  await handle.write(Buffer.alloc(Math.max(16 * 1024, size)), 0)
  await handle.sync()
  const parent = await open(dir, 'r')
  await parent.sync()
  await parent.close()
  return handle
}

export async function clientBench(options: {
  rounds: number
  requestsPerRound: number
  log: (line: string) => void
}): Promise<ClientSummary[]> {
  const { server, url } = await listen()
  const dir = await mkdtemp(path.join(os.tmpdir(), 'oncely-bench-client-'))
  const body = LEDGER_BODY
  const record = Buffer.from(JSON.stringify(ledgerIntent(url)))
  const floor = await floorFile(dir, record.length)
  const clients: OncelyClient[] = []
  const oncely = (store: IntentStore): Send => {
    const client = createClient({ baseUrl: url, store, resumeOnStart: false, resumeOnOnline: false })
    clients.push(client)
    return () => client.request({ path: '/ledger', json: body })
  }
  const senders: Record<'ky' | 'memoryStore' | 'fileStore' | 'fdatasync', Send> = {
    ky: () =>
      ky.post(`${url}/ledger`, { json: body, headers: { 'idempotency-key': randomUUID() }, retry: 0 }).json(),
    memoryStore: oncely(memoryStore()),
    fileStore: oncely(fileStore({ dir: path.join(dir, 'store') })),
    fdatasync: async () => {
      await floor.write(record, 0, record.length, 0)
      await floor.datasync()
    },
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
    return summarize(rounds, ['ky', 'memoryStore', 'fileStore'], 'ky', 'node')
  } finally {
    for (const client of clients) await client.close()
    await floor.close()
    server.close()
    await rm(dir, { recursive: true, force: true })
  }
}
