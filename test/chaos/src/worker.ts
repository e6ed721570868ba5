/**
 * A client worker: one child process standing for one user's device. It uses @oncely/client with a fileStore, reads
 * commands from stdin and reports what happened as JSON lines on stdout (history events without index and time;
 * the driver adds them). With `ONCELY_CHAOS_WORKER_CRASH_AT` set it SIGKILLs itself at a client step, so a restart
 * has to `resume()` from the store.
 *
 * Commands (one JSON object per line):
 * - `{"type":"request","intent":"i00001","body":{...}}`: a user intent, through `client.request` with
 *   `intentId` = the intent id (the key is derived from it).
 * - `{"type":"probe","intent":"i00042","kind":"changed-payload","key":"<original key>","body":{...}}`: the same
 *   key with another body (or the same body in another member order, or the same body after the key expired), sent
 *   raw the way a buggy or foreign client would, because the SDK refuses a changed payload locally before it
 *   reaches the server and settles an intent only once.
 *   With `"again":true` (and `"firstAttempt"`), the same probe once more after it ended without a definite answer.
 * - `{"type":"resume"}`: re-drive the store's pending intents. `{"type":"heal"}`: no more crash points.
 *   `{"type":"drain"}`: resume, then report `pending()`.
 */
import { createInterface } from 'node:readline'
import { createClient, type IntentStore, isHTTPError, type OncelyResponse } from '@oncely/client'
import { fileStore } from '@oncely/client/node'
import { IDEMPOTENCY_KEY_HEADER } from '@oncely/protocol'
import type { WORKER_CRASH_POINTS } from './faults.js'
import type { PaymentBody, ReportedEvent } from './history.js'
import { nextProbeDelay } from './probe-budget.js'
import { createRandom } from './random.js'
import { workerEnv } from './worker-env.js'
import { writeLineSync } from './write-line.js'

type Command =
  | { type: 'request'; intent: string; body: PaymentBody }
  | {
      type: 'probe'
      intent: string
      of: string
      kind: 'changed-payload' | 'reordered' | 'expired-replay' | 'expired-changed-payload' | 'failover-replay'
      key: string
      body: PaymentBody
      /** Sent again after it ended without a definite answer: no new invoke, attempts from `firstAttempt`. */
      again?: boolean
      firstAttempt?: number
    }
  | { type: 'resume' }
  | { type: 'heal' }
  | { type: 'drain' }

const env = workerEnv(process.env)
const random = createRandom(env.seed)
const PATH = '/v1/payments'

// Synchronous, so an event is out before a self-inflicted SIGKILL.
function emit(event: ReportedEvent | { type: 'ready' }): void {
  writeLineSync(1, JSON.stringify(event))
}

let healed = false

function maybeCrash(point: (typeof WORKER_CRASH_POINTS)[number]): void {
  if (healed || !env.crashAt.has(point) || !random.chance(env.crashRate)) return
  emit({ type: 'fault', fault: `kill-worker-${point}`, target: env.name, phase: 'once' })
  process.kill(process.pid, 'SIGKILL')
}

// Crash points wrap the store (the write-ahead) and fetch (the wire), the two boundaries of a client step.
function crashingStore(inner: IntentStore): IntentStore {
  return {
    ...inner,
    attach: inner.attach?.bind(inner),
    exclusive: inner.exclusive?.bind(inner),
    async set(record) {
      await inner.set(record)
      if (record.version === 1) maybeCrash('after-intent-write')
    },
  }
}

const crashingFetch: typeof fetch = async (input, init) => {
  const sent = fetch(input, init)
  // The request may fail while we wait below; without a handler that is an unhandled rejection killing the worker.
  sent.catch(() => {})
  if (env.crashAt.has('after-send')) {
    await new Promise((resolve) => setTimeout(resolve, 5)) // let the request bytes leave
    maybeCrash('after-send')
  }
  const response = await sent
  if (env.crashAt.has('after-response')) {
    const copy = response.clone()
    await copy.arrayBuffer()
    maybeCrash('after-response')
  }
  return response
}

const store = fileStore({ dir: env.storeDir })
// Explicit (it is the default) because reportStoredOutcomes() derives from it when a stored answer was received.
const SETTLED_TTL_MS = 10 * 60 * 1000
const client = createClient({
  settledTtlMs: SETTLED_TTL_MS,
  baseUrl: env.baseUrl,
  store: crashingStore(store),
  headers: () => ({ authorization: `Bearer ${env.tenant}` }),
  fetch: crashingFetch,
  timeoutMs: env.timeoutMs,
  retry: { limit: 6, minDelayMs: 50, maxDelayMs: 1000, maxElapsedMs: env.timeoutMs * 8 },
  resumeOnOnline: false,
})

const keys = new Map<string, string>()
client.on('attempt', ({ id, key, attempt }) => {
  keys.set(id, key)
  emit({ type: 'attempt', phase: 'invoke', intent: id, key, attempt, sentAt: Date.now() })
})
client.on('retry', ({ id, key, attempt, reason }) => {
  emit({ type: 'attempt', phase: 'info', intent: id, key, attempt, error: reason })
})

function settled(intent: string, response: OncelyResponse): void {
  const ok = { status: response.status, body: response.data }
  const receivedAt = Date.now()
  emit({
    type: 'intent',
    phase: 'ok',
    intent,
    tenant: env.tenant,
    key: response.key,
    response: ok,
    receivedAt,
  })
}

function failed(intent: string, error: unknown): void {
  const key = keys.get(intent)
  if (isHTTPError(error)) {
    // A non-retried 4xx: the intent is settled as failed with this response.
    const response = { status: error.status, body: error.data }
    const receivedAt = Date.now()
    emit({
      type: 'intent',
      phase: 'fail',
      intent,
      tenant: env.tenant,
      ...(key ? { key } : {}),
      response,
      receivedAt,
    })
    return
  }
  // Retries exhausted, network, expiry: the outcome is unknown (the intent may stay pending for resume).
  emit({
    type: 'intent',
    phase: 'info',
    intent,
    tenant: env.tenant,
    ...(key ? { key } : {}),
    error: String(error),
  })
}

async function request(intent: string, body: PaymentBody): Promise<void> {
  emit({ type: 'intent', phase: 'invoke', intent, tenant: env.tenant, kind: 'normal', body })
  try {
    settled(intent, await client.request({ path: PATH, json: body, intentId: intent }))
  } catch (error) {
    failed(intent, error)
  }
}

/** A raw same-key request: retried on 409, 503 and network errors until a definite answer or the budget ends. */
async function probe(command: Extract<Command, { type: 'probe' }>): Promise<void> {
  const { intent, of, key, kind, body } = command
  if (!command.again)
    emit({ type: 'intent', phase: 'invoke', intent, tenant: env.tenant, key, kind, of, body })
  const started = Date.now()
  for (let attempt = command.firstAttempt ?? 1; ; attempt++) {
    emit({ type: 'attempt', phase: 'invoke', intent, key, attempt, sentAt: Date.now() })
    try {
      const res = await fetch(new URL(PATH, env.baseUrl), {
        method: 'POST',
        headers: {
          authorization: `Bearer ${env.tenant}`,
          'content-type': 'application/json',
          [IDEMPOTENCY_KEY_HEADER]: key,
        },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(env.timeoutMs),
      })
      const text = await res.text()
      const response = { status: res.status, body: text ? parseJson(text) : null }
      if (res.status !== 409 && res.status < 500) {
        const phase = res.status < 300 ? 'ok' : 'fail'
        emit({ type: 'intent', phase, intent, tenant: env.tenant, key, response, receivedAt: Date.now() })
        return
      }
      emit({ type: 'attempt', phase: 'ok', intent, key, attempt, response })
    } catch (error) {
      emit({ type: 'attempt', phase: 'info', intent, key, attempt, error: String(error) })
    }
    const delay = nextProbeDelay(attempt, Date.now() - started)
    if (delay === undefined) break
    await new Promise((resolve) => setTimeout(resolve, delay))
  }
  emit({ type: 'intent', phase: 'info', intent, tenant: env.tenant, key, error: 'probe budget exhausted' })
}

async function resume(): Promise<void> {
  for (const outcome of await client.resume()) {
    if (outcome.outcome === 'settled') settled(outcome.id, outcome.response)
    else if (outcome.outcome === 'failed') failed(outcome.id, outcome.error)
  }
}

async function handle(command: Command): Promise<void> {
  switch (command.type) {
    case 'request':
      return request(command.intent, command.body)
    case 'probe':
      return probe(command)
    case 'resume':
      return resume()
    case 'heal':
      healed = true
      return
    case 'drain': {
      await resume()
      const pending = (await client.pending()).map((intent) => intent.id)
      emit({ type: 'drain', pending })
    }
  }
}

/**
 * A previous incarnation may have settled an intent in the store and died before reporting it; `resume()` skips
 * settled records, so their stored outcome is reported here, with when it was received (a repeat of an already
 * reported outcome is harmless).
 */
async function reportStoredOutcomes(): Promise<void> {
  for (const record of await store.list()) {
    if ((record.state !== 'settled' && record.state !== 'failed') || !record.outcome) continue
    const { status, text } = record.outcome
    const response = { status, body: text ? parseJson(text) : null }
    const phase = record.state === 'settled' ? 'ok' : 'fail'
    // The checker judges the answer by when it arrived (during a failover, say), not by this late report.
    const receivedAt = record.keepUntil === undefined ? {} : { receivedAt: record.keepUntil - SETTLED_TTL_MS }
    emit({
      type: 'intent',
      phase,
      intent: record.id,
      tenant: env.tenant,
      key: record.key,
      response,
      ...receivedAt,
    })
  }
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text)
  } catch {
    return text
  }
}

await reportStoredOutcomes()
createInterface({ input: process.stdin }).on('line', (line) => {
  if (line.trim() === '') return
  void handle(JSON.parse(line) as Command).catch((error) => {
    process.stderr.write(`worker ${env.name}: ${(error as Error).stack ?? error}\n`)
  })
})
emit({ type: 'ready' })
