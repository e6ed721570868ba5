/**
 * A seeded fuzzer against the real entry point (`src/main.ts` as a child process, on a real Postgres): random and
 * hostile requests from fast-check (Idempotency-Key forms, content types, bodies from valid payments to invalid
 * UTF-8, methods and paths), each on its own socket. For every request: no 5xx, every 4xx is problem+json, a body
 * that is not UTF-8 is refused, and a refused request leaves the key of its tenant as it found it. After the run: healthy, and a fresh payment runs once.
 *
 * ONCELY_FUZZ_RUNS (default 300) and ONCELY_FUZZ_SEED (default fixed) make a longer or another run; a failure prints
 * the seed and the shrunk request.
 */
import { isUtf8 } from 'node:buffer'
import { randomUUID } from 'node:crypto'
import { parseIdempotencyKey } from '@oncely/protocol'
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import fc from 'fast-check'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { tenantFromAuthorization } from '../src/auth.js'
import { count } from './support/app.js'
import {
  type FuzzRequest,
  fuzzRequest,
  headerValues,
  NONCE,
  type RawResponse,
  render,
  sendRaw,
} from './support/fuzz-requests.js'
import { type Started, startMain } from './support/main.js'

const RUNS = positiveInteger('ONCELY_FUZZ_RUNS', 300)
const SEED = positiveInteger('ONCELY_FUZZ_SEED', 20_261_201)

function positiveInteger(name: string, fallback: number): number {
  const text = process.env[name]
  if (text === undefined || text === '') return fallback
  const value = Number(text)
  if (!Number.isSafeInteger(value) || value < 0)
    throw new Error(`${name} must be a non-negative integer, got "${text}"`)
  return value
}

let db: TestDatabase
let api: Started
beforeAll(async () => {
  db = await createTestDatabase('payments_fuzz')
  api = await startMain({ DATABASE_URL: db.url })
})
afterAll(async () => {
  if (api) {
    api.child.kill('SIGTERM')
    await api.exited
  }
  await db?.drop()
})

/** Key rows of one tenant and key: what a request may have reserved. */
const keyRows = (tenant: string, key: string) =>
  db.pool
    .query<{ n: number }>(
      'SELECT count(*)::int AS n FROM oncely.idempotency_keys WHERE scope = $1 AND key = $2',
      [tenant, key],
    )
    .then((r) => r.rows[0]!.n)

/** The key and tenant the server reads from the request (Node joins repeated lines with ", "), when both parse. */
function keyOf(request: FuzzRequest): { tenant: string; key: string } | undefined {
  const values = headerValues(request, 'idempotency-key').map((v) => v.replace(/^[ \t]+|[ \t]+$/g, ''))
  const parsed = parseIdempotencyKey(values.length === 0 ? undefined : values.join(', '))
  const tenant = tenantFromAuthorization(headerValues(request, 'authorization')[0])
  return parsed.ok && tenant !== undefined ? { tenant, key: parsed.key } : undefined
}

const describeResponse = (res: RawResponse) =>
  `${res.status} ${res.headers['content-type'] ?? '(no content-type)'} ${res.body.toString('utf8').slice(0, 300)}`

/** The problem's `code` (or `title`), to tally what the run reached. */
function codeOf(res: RawResponse): string {
  try {
    const problem = JSON.parse(res.body.toString('utf8'))
    return String(problem.code ?? problem.title ?? '')
  } catch {
    return '(not JSON)'
  }
}

let sent = 0
let lastKeyId = ''
/** How many answers of each status and problem code the run got: printed, and checked for reach. */
const outcomes = new Map<string, number>()

async function check(generated: FuzzRequest): Promise<void> {
  sent++
  if (!generated.reuseKey || lastKeyId === '') lastKeyId = `fz${SEED}-${sent}`
  const request = render(generated, lastKeyId)
  const target = keyOf(request)
  const before = target ? await keyRows(target.tenant, target.key) : 0
  const res = await sendRaw(api.url, request)
  const what = `${request.method} ${request.path} answered ${describeResponse(res)}`
  const outcome =
    res.status >= 400 && request.method !== 'HEAD' ? `${res.status} ${codeOf(res)}` : `${res.status}`
  outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1)

  expect(
    res.status,
    `a 5xx for a client's request: ${what}\n--- server log ---\n${api.output().slice(-4_000)}`,
  ).toBeLessThan(500)
  if (res.status >= 400 && request.method !== 'HEAD') {
    expect(res.headers['content-type'], what).toMatch(/^application\/problem\+json/)
    expect(JSON.parse(res.body.toString('utf8')), what).toMatchObject({ status: res.status })
  }
  // JSON text is UTF-8: a payment whose bytes are not is refused, never booked with U+FFFD in their place.
  if (request.method === 'POST' && Array.isArray(request.body) && !isUtf8(Buffer.from(request.body)))
    expect(res.status, `a body that is not UTF-8 was accepted: ${what}`).toBeGreaterThanOrEqual(400)
  if (!target) return
  const after = await keyRows(target.tenant, target.key)
  // 402 is a declined payment: executed, and stored for replay like a success.
  if (res.status >= 400 && res.status !== 402)
    expect(after, `a refused request changed its key's rows: ${what}`).toBe(before)
  if (res.status === 201) expect(after, `a payment without its key row: ${what}`).toBe(1)
}

// A run that never got past the first check would prove nothing: it must reach the engine, the strict parser, the
// schema and the key parser.
const MUST_REACH = [
  '201',
  '400 invalid_json',
  '400 invalid_request',
  '400 idempotency_key_malformed',
  '401 unauthorized',
]

it(`answers ${RUNS} random requests without a 5xx, with problem+json for every 4xx, reserving nothing it refuses`, {
  timeout: 60_000 + RUNS * 200,
}, async () => {
  try {
    await fc.assert(fc.asyncProperty(fuzzRequest, check), { seed: SEED, numRuns: RUNS })
  } catch (error) {
    throw new Error(
      `${(error as Error).message}\n\nReproduce with ONCELY_FUZZ_SEED=${SEED} ONCELY_FUZZ_RUNS=${RUNS}; the counterexample is the shrunk request, where "${NONCE}" in a header stands for a fresh key id.`,
      { cause: error },
    )
  }
  const tally = [...outcomes].sort(([a], [b]) => a.localeCompare(b)).map(([o, n]) => `  ${o}: ${n}`)
  console.log(`fuzz: ${sent} requests from seed ${SEED}\n${tally.join('\n')}`)
  if (RUNS >= 300) for (const outcome of MUST_REACH) expect(outcomes.get(outcome), outcome).toBeGreaterThan(0)

  const health = await fetch(`${api.url}/healthz`)
  expect(health.status).toBe(200)
  expect(await health.json()).toEqual({ status: 'ok' })
  const key = randomUUID()
  const pay = () =>
    fetch(`${api.url}/v1/payments`, {
      method: 'POST',
      headers: { authorization: 'Bearer fuzz', 'idempotency-key': key, 'content-type': 'application/json' },
      body: JSON.stringify({ amount: 1250, currency: 'eur', reference: 'after the fuzz' }),
    })
  const first = await pay()
  const again = await pay()
  expect(first.status).toBe(201)
  expect(again.status).toBe(201)
  expect(again.headers.get('idempotent-replayed')).toBe('true')
  expect(await count(db.pool, 'payments', ['idempotency_key', key])).toBe(1)
})
