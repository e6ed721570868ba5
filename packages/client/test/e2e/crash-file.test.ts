// fileStore against real crashes: a child process runs one scenario of the client (write-ahead, send, settle,
// delete, discard, resume) on a real directory and SIGKILLs itself at one step, every step of the scenario in turn
// (each file-system call of the store, before, during and after it, a write also torn in half; the request in
// flight and its answer received). Then this process opens the directory with a new store and checks the store's
// promises against what the child's caller had been told:
//
// - an intent whose write-ahead was acknowledged (its first attempt was about to be sent) is never lost, unless the
//   server gave its final answer (the child may have recorded it before dying);
// - an intent whose answer the caller had, or that the caller discarded, never comes back as pending, and is never
//   sent again by resume();
// - a write-ahead reported as failed never comes back and is never sent;
// - a torn record is ignored, never quarantined, never an error.
import { type ChildProcess, execFileSync, spawn } from 'node:child_process'
import { cp, mkdtemp, rm } from 'node:fs/promises'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { build } from 'esbuild'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createClient, type IntentRecord } from '../../src/index.js'
import { fileStore } from '../../src/stores/node.js'
import { expectNothingResent, expectPromisesKept, type Fact } from './support/promises.js'

const packageDir = fileURLToPath(new URL('../..', import.meta.url))
let work: string
let child: string
let server: Server
let baseUrl: string
// Every key the server received, in order; the keys it gave a final answer to (a response other than 503 that was
// written out); how many attempts each key got; and the most requests of one key it ever had in flight at once.
const received: string[] = []
const answered = new Set<string>()
const attempts = new Map<string, number>()
const inFlight = new Map<string, number>()
let mostInFlight = 0
// Requests with a body over 30,000 bytes: only write-aheads that a full disk refused have one.
let largeBodies = 0

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), 'oncely-crash-'))
  // Bundled once, so each of the many children starts in tens of milliseconds.
  child = join(work, 'crash-child.mjs')
  await build({
    entryPoints: [fileURLToPath(new URL('./fixtures/crash-child.ts', import.meta.url))],
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    conditions: ['@oncely/source'],
    outfile: child,
    logLevel: 'silent',
  })
  // POST /pay?fail=N answers 503 to the first N attempts of a key, then 201 (after 30 ms with slow=1); with
  // hold=1 it never answers.
  server = createServer((request, response) => {
    const key = String(request.headers['idempotency-key'])
    received.push(key)
    const count = (attempts.get(key) ?? 0) + 1
    attempts.set(key, count)
    inFlight.set(key, (inFlight.get(key) ?? 0) + 1)
    mostInFlight = Math.max(mostInFlight, inFlight.get(key)!)
    const done = () => inFlight.set(key, inFlight.get(key)! - 1)
    response.on('close', done)
    const query = new URL(request.url!, 'http://x').searchParams
    if (Number(request.headers['content-length']) > 30_000) largeBodies++
    request.resume()
    request.on('end', () => {
      if (query.get('hold')) return
      const status = count <= Number(query.get('fail') ?? 0) ? 503 : 201
      if (status !== 503) response.on('finish', () => answered.add(key))
      setTimeout(
        () => {
          response.writeHead(status, { 'content-type': 'application/json' })
          response.end(JSON.stringify({ key }))
        },
        status === 201 && query.get('slow') ? 30 : 0,
      )
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
}, 60_000)
afterAll(async () => {
  server?.close()
  if (work) await rm(work, { recursive: true, force: true })
})

type Phase = 'before' | 'during' | 'after' | 'torn'

async function run(dir: string, scenario: string, kill?: { step: number; phase: Phase }, filler?: string) {
  const config = JSON.stringify({ dir, baseUrl, scenario, kill, filler })
  const proc: ChildProcess = spawn(process.execPath, [child, config], {
    cwd: packageDir,
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let out = ''
  let err = ''
  proc.stdout!.on('data', (chunk: Buffer) => {
    out += chunk
  })
  proc.stderr!.on('data', (chunk: Buffer) => {
    err += chunk
  })
  const signal = await new Promise<NodeJS.Signals | null>((resolve) =>
    proc.on('exit', (_, sig) => resolve(sig)),
  )
  const facts = out
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line) as Fact)
  if (!kill && !facts.some((fact) => fact.done))
    throw new Error(`${scenario} did not finish:\n${out}\n${err}`)
  if (kill && signal !== 'SIGKILL' && !facts.some((fact) => fact.done)) {
    throw new Error(`${scenario} died of ${signal} at ${JSON.stringify(kill)}:\n${err}`)
  }
  return facts
}

// The kill points of a scenario: each step of a trace (a step repeated by a loop, such as the attempts of a retry,
// at its first two occurrences only), before it; during a flush, rename, unlink or request (the call started, not
// awaited); and for a record write, torn in half. After a step is before the next.
function killPoints(trace: Fact[]): { step: number; phase: Phase; label: string }[] {
  const occurrences = new Map<string, number>()
  return trace
    .filter((fact) => typeof fact.step === 'number')
    .filter(({ label }) => {
      const count = (occurrences.get(String(label)) ?? 0) + 1
      occurrences.set(String(label), count)
      return count <= 2
    })
    .flatMap(({ step, label }) => {
      const name = String(label)
      const phases: Phase[] = ['before']
      if (/^(datasync|sync|rename|unlink|fetch)/.test(name)) phases.push('during')
      if (/^write (cells|slot)/.test(name)) phases.push('torn')
      return phases.map((phase) => ({ step: Number(step), phase, label: name }))
    })
}

// What the store left must agree with what the child's caller was told; then resume() must send nothing that was
// answered or discarded.
async function check(dir: string, facts: Fact[], where: string) {
  const store = fileStore({ dir })
  const quarantined: unknown[] = []
  store.attach?.((event, payload) => {
    if (event === 'quarantined') quarantined.push(payload)
  })
  const records = new Map<string, IntentRecord>((await store.list()).map((r) => [r.id, r]))
  expectPromisesKept(facts, records, answered, where)
  expect(quarantined, `${where}: quarantined`).toEqual([])
  const sentBefore = received.length
  const client = createClient({ baseUrl, store, resumeOnOnline: false, retry: { limit: 0 } })
  await client.resume()
  await client.close()
  expectNothingResent(facts, new Set(received.slice(sentBefore)), where)
}

// Scenarios that start from an empty directory, and those that start from an intent left pending by a run that
// gave up on it.
const scenarios: { name: string; pendingFirst: boolean }[] = [
  { name: 'one-off', pendingFirst: false },
  { name: 'named', pendingFirst: false },
  { name: 'retry', pendingFirst: false },
  { name: 'pending', pendingFirst: false },
  { name: 'discard', pendingFirst: true },
  { name: 'resume', pendingFirst: true },
]

describe('fileStore, SIGKILLed at every step', () => {
  for (const { name, pendingFirst } of scenarios) {
    it(`${name}: the store keeps its promises whichever step the process dies at`, async () => {
      // An intent left pending by a run that gave up on it, prepared once and copied for each run; what that run's
      // caller was told counts too.
      const start = await mkdtemp(join(work, `${name}-start-`))
      const before = pendingFirst ? await run(start, 'pending') : []
      const fresh = async () => {
        const dir = await mkdtemp(join(work, `${name}-`))
        await cp(start, dir, { recursive: true })
        return dir
      }
      const traceDir = await fresh()
      const trace = await run(traceDir, name)
      await rm(traceDir, { recursive: true, force: true })
      const points = killPoints(trace)
      expect(points.length).toBeGreaterThan(pendingFirst ? 4 : 10)
      const seen = new Set<string>()
      for (const point of points) {
        const dir = await fresh()
        const facts = await run(dir, name, point)
        seen.add(point.label)
        await check(
          dir,
          [...before, ...facts],
          `${name}, killed ${point.phase} step ${point.step} (${point.label})`,
        )
        await rm(dir, { recursive: true, force: true })
      }
      // The steps that matter were all crashed at: the write-ahead, its flush, the send, and the emptying write.
      const labels = [...seen].join(', ')
      const expected: Record<string, string[]> = {
        'one-off': ['datasync cells', 'fetch', 'write cells'],
        named: ['datasync slot', 'rename slot to json', 'fetch', 'write slot'],
        retry: ['datasync cells', 'fetch', 'write cells'],
        pending: ['datasync cells', 'fetch', 'write cells'],
        discard: ['write cells', 'datasync cells'],
        resume: ['open lock', 'fetch', 'write cells', 'unlink lock'],
      }
      for (const label of expected[name]!) expect(labels).toContain(label)
    }, 120_000)
  }
})

describe('fileStore, one driver at a time across real processes', () => {
  it('a process driving an intent it created keeps others off it while it runs, and loses it when SIGKILLed', async () => {
    const dir = await mkdtemp(join(work, 'hold-'))
    const proc = spawn(process.execPath, [child, JSON.stringify({ dir, baseUrl, scenario: 'hold' })], {
      stdio: ['ignore', 'pipe', 'inherit'],
    })
    let out = ''
    proc.stdout!.on('data', (chunk: Buffer) => {
      out += chunk
    })
    const exited = new Promise((resolve) => proc.on('exit', resolve))
    const deadline = Date.now() + 20_000
    while (!out.includes('"ack"')) {
      if (Date.now() > deadline) throw new Error(`the child never sent its request:\n${out}`)
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
    const facts = out
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as Fact)
    const key = String(facts.find((fact) => fact.ack)!.key)
    const store = fileStore({ dir })
    const client = createClient({
      baseUrl,
      store,
      resumeOnOnline: false,
      timeoutMs: 300,
      retry: { limit: 0 },
    })
    expect(await client.resume()).toEqual([{ id: key, key, outcome: 'skipped', reason: 'busy' }])
    proc.kill('SIGKILL')
    await exited
    // The owner is gone: its intent is any process's to drive, with the same key.
    const before = received.filter((k) => k === key).length
    const [outcome] = await client.resume()
    expect(outcome).toMatchObject({ id: key, outcome: 'failed' }) // driven: the server holds this request too
    expect(received.filter((k) => k === key).length).toBe(before + 1)
    await client.close()
  })

  it('two processes resuming the same pending intents at once send each intent one request at a time', async () => {
    const dir = await mkdtemp(join(work, 'race-'))
    await run(dir, 'pending-many')
    mostInFlight = 0
    const runs = await Promise.all([run(dir, 'resume'), run(dir, 'resume')])
    const settled = runs.flat().filter((fact) => typeof fact.answered === 'string')
    expect(settled).toHaveLength(6) // each intent settled by exactly one of the two
    expect(new Set(settled.map((fact) => fact.answered)).size).toBe(6)
    expect(mostInFlight).toBe(1)
    expect(await fileStore({ dir }).list()).toEqual([])
  })
})

// A small tmpfs, mounted for this test (root only): a real full disk, refusing writes with ENOSPC.
const mountable = process.platform === 'linux' && process.getuid?.() === 0
if (!mountable) console.warn('full-disk run skipped: mounting a tmpfs needs root on Linux')

describe.skipIf(!mountable)('fileStore on a full disk, SIGKILLed at every step after it filled up', () => {
  let mount: string
  beforeAll(async () => {
    mount = await mkdtemp(join(tmpdir(), 'oncely-full-'))
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m,mode=0700', 'tmpfs', mount])
  })
  afterAll(async () => {
    if (!mount) return
    execFileSync('umount', [mount])
    await rm(mount, { recursive: true, force: true })
  })

  it('refuses write-aheads it cannot make durable, and none of them ever comes back or is sent', async () => {
    const dir = join(mount, 'store')
    const filler = join(mount, 'filler')
    const reset = async () => {
      await rm(dir, { recursive: true, force: true })
      await rm(filler, { force: true })
    }
    await reset()
    const trace = await run(dir, 'full-disk', undefined, filler)
    const full = trace.findIndex((fact) => fact.full)
    expect(trace.filter((fact) => fact.rejected).map((fact) => [fact.rejected, fact.name])).toEqual([
      ['full:big', 'QuotaExceededError'],
      ['bigger', 'QuotaExceededError'],
    ])
    expect(trace.some((fact) => fact.answered && fact.status === 201 && fact.key)).toBe(true)
    const points = killPoints(trace.slice(full))
    expect(points.map((point) => point.label)).toEqual(expect.arrayContaining(['write slot', 'unlink slot']))
    for (const point of points) {
      await reset()
      const facts = await run(dir, 'full-disk', point, filler)
      await rm(filler, { force: true }) // room again: what was refused must still never come back
      await check(dir, facts, `full disk, killed ${point.phase} step ${point.step} (${point.label})`)
      const records = await fileStore({ dir }).list()
      expect(records.filter((r) => (r.body?.data.length ?? 0) > 30_000)).toEqual([])
    }
    expect(largeBodies).toBe(0)
    await reset()
  }, 120_000)
})
