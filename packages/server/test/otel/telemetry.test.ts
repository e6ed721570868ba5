// The server's OpenTelemetry instrumentation, on the SDK's in-memory exporters: one scripted sequence (first
// execution, replay, mismatch, concurrent duplicate, crash and takeover, fenced-out attempt, outbox publish, inbox)
// gives exactly the expected counts, spans and parent links, and the instrumented engine answers exactly as the bare
// one. Runs under both reservation protocols (vitest.config.ts).
import { readFileSync } from 'node:fs'
import type { TestDatabase } from '@oncely/test-support'
import { context, SpanKind, SpanStatusCode, trace } from '@opentelemetry/api'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { ENGINE_SIGNALS, type Observable } from '../../src/hooks.js'
import { createInbox } from '../../src/inbox/index.js'
import { createEngine, type Engine, type EngineEvent, postgresStore } from '../../src/index.js'
import { instrumentDispatcher, instrumentEngine, traceHeaders, VERSION } from '../../src/otel/index.js'
import { createDispatcher, enqueue, type OutboxMessage } from '../../src/outbox/index.js'
import {
  engineFor,
  fingerprintOf,
  freshKey,
  gate,
  pay,
  paymentsFor,
  payRequest,
  reservation,
  setupDatabase,
  sleep,
  stallEventLoop,
} from '../helpers.js'
import { parentOf, testSdk } from './support.js'

const row = reservation === 'row'
const OPERATION = 'POST /v1/payments'
let db: TestDatabase
const sdk = testSdk()
const telemetry = () => ({ tracerProvider: sdk.tracerProvider, meterProvider: sdk.meterProvider })

beforeAll(async () => {
  db = await setupDatabase('otel')
})
afterAll(async () => {
  await sdk.shutdown()
  await db.drop()
})

/** An instrumented engine on the test database (with fault hooks when given), and its events. */
function instrumented(options: Parameters<typeof engineFor>[1] = {}) {
  const { engine, events } = engineFor(db.pool, options)
  return { engine: instrumentEngine(engine, telemetry()), events }
}

describe('the scripted sequence', () => {
  const tenant = freshKey('tenant')
  let httpSpan: { traceId: string; spanId: string }
  let published: OutboxMessage[] = []

  it('gives exactly the expected counts, spans and parent links', async () => {
    // Long enough that no step's attempt loses its key to a stall of a busy machine; the crash and the stall below
    // have short leases of their own.
    const { engine } = instrumented({ leaseMs: 10_000 })
    const key = freshKey('first')

    // 1. A first execution, inside an "HTTP server" span (what HTTP instrumentation makes active), that enqueues.
    const server = sdk.tracer.startSpan('POST /v1/payments', { kind: SpanKind.SERVER })
    httpSpan = server.spanContext()
    const first = await context.with(trace.setSpan(context.active(), server), () =>
      engine.execute(
        payRequest(tenant, key, {
          handler: async (ctx) => {
            await enqueue(ctx.tx, { topic: 'payments.created', payload: { key }, headers: traceHeaders() })
            return pay(key)(ctx)
          },
        }),
      ),
    )
    server.end()
    expect(first).toMatchObject({ kind: 'executed', attempt: 1 })

    // 2. Its replay, 3. the key reused with another body.
    expect(await engine.execute(payRequest(tenant, key))).toMatchObject({
      kind: 'replayed',
      fencedOut: false,
    })
    expect(
      await engine.execute(payRequest(tenant, key, { fingerprint: fingerprintOf({ other: true }) })),
    ).toMatchObject({ kind: 'mismatch' })

    // 4. Concurrent duplicates: one answered in_progress at once, one that waits and gets the replay.
    const busyKey = freshKey('busy')
    const holding = gate()
    const release = gate()
    const owner = engine.execute(
      payRequest(tenant, busyKey, {
        handler: async (ctx) => {
          holding.open()
          await release.opened
          return pay(busyKey)(ctx)
        },
      }),
    )
    await holding.opened
    expect(await engine.execute(payRequest(tenant, busyKey))).toMatchObject({ kind: 'in_progress' })
    const waiting = engine.execute(payRequest(tenant, busyKey, { wait: { timeoutMs: 10_000 } }))
    await sleep(50)
    release.open()
    expect(await owner).toMatchObject({ kind: 'executed' })
    expect(await waiting).toMatchObject({ kind: 'replayed' })

    // 5. A crash after a recovery point (the key stays leased under both protocols), then the takeover.
    const crashKey = freshKey('crash')
    const crash = new Error('crash before commit')
    // A lease of a second: the attempt must reach its crash through a loaded machine's stalls.
    const crashing = instrumented({
      leaseMs: 1_000,
      hooks: {
        beforeCommit: () => {
          throw crash
        },
      },
    })
    const charged = async (ctx: Parameters<ReturnType<typeof pay>>[0]) => {
      await ctx.saveRecoveryPoint('charged')
      return pay(crashKey)(ctx)
    }
    await expect(crashing.engine.execute(payRequest(tenant, crashKey, { handler: charged }))).rejects.toBe(
      crash,
    )
    // Waits out the crashed attempt's lease, however late its last renewal landed.
    expect(await engine.execute(payRequest(tenant, crashKey, { wait: { timeoutMs: 10_000 } }))).toMatchObject(
      { kind: 'executed', attempt: 2 },
    )

    // 6. An attempt whose process stalled past its lease is fenced out and answers with the winner's response.
    const pausedKey = freshKey('paused')
    const paused = gate()
    const atCommit = gate()
    const slow = instrumented({
      leaseMs: 1_000, // reaches its commit hook through a loaded machine's stalls, then stalls past it
      hooks: {
        beforeCommit: async () => {
          atCommit.open()
          stallEventLoop(1_050)
          await paused.opened
        },
      },
    })
    const original = slow.engine.execute(payRequest(tenant, pausedKey, { handler: pay(`${pausedKey}-1`) }))
    await atCommit.opened
    // The winner's own lease is long: only the paused attempt's is meant to run out, however busy the machine.
    const winner = await instrumented({ leaseMs: 10_000 }).engine.execute(
      payRequest(tenant, pausedKey, { handler: pay(`${pausedKey}-2`), wait: { timeoutMs: 5_000 } }),
    )
    expect(winner).toMatchObject({ kind: 'executed' })
    paused.open()
    expect(await original).toMatchObject({ kind: 'replayed', fencedOut: true })
    expect(await paymentsFor(db.pool, `${pausedKey}-1`)).toBe(0)

    // A stored permanent failure, and a store that cannot be reached.
    const declined = Object.assign(new Error('declined'), { statusCode: 402 })
    expect(
      await engine.execute(
        payRequest(tenant, freshKey('declined'), {
          handler: async () => {
            throw declined
          },
        }),
      ),
    ).toMatchObject({ kind: 'executed', status: 'failed_permanent' })
    const nowhere = new pg.Pool({ connectionString: 'postgres://postgres@127.0.0.1:1/none', max: 1 })
    nowhere.on('error', () => {})
    const down = instrumentEngine(
      createEngine({ store: postgresStore({ pool: nowhere }), reservation }),
      telemetry(),
    )
    expect(await down.execute(payRequest(tenant, freshKey('down')))).toMatchObject({ kind: 'unavailable' })
    await nowhere.end()

    // 7. The outbox: the lag shows the pending message; one publish.
    const lagBefore = await sdk.points('oncely.server.outbox.lag')
    const recorder = { publish: async (message: OutboxMessage) => void published.push(message) }
    const dispatcher = createDispatcher(
      instrumentDispatcher({ pool: db.pool, publisher: recorder }, telemetry()),
    )
    expect(lagBefore).toHaveLength(0) // no dispatcher was instrumented yet: nothing observed
    expect(await sdk.total('oncely.server.outbox.lag')).toBeGreaterThan(0)
    expect(await dispatcher.dispatchOnce()).toBe(1)
    expect(await sdk.total('oncely.server.outbox.lag')).toBe(0)
    expect(published).toHaveLength(1)

    // 8. The reaper.
    await engine.reap()

    // Exact counts, by outcome, for the operation.
    const requests = (outcome: string) =>
      sdk.total('oncely.server.requests', { 'oncely.operation': OPERATION, 'oncely.outcome': outcome })
    expect({
      executed: await requests('executed'),
      replayed: await requests('replayed'),
      mismatch: await requests('mismatch'),
      in_progress: await requests('in_progress'),
      fenced_out: await requests('fenced_out'),
      unavailable: await requests('unavailable'),
      failed_retryable: await requests('failed_retryable'),
      failed_permanent: await requests('failed_permanent'),
    }).toEqual({
      executed: 4, // first, the busy key's owner, the takeover, the paused key's winner
      replayed: 2, // the replay, the duplicate that waited
      mismatch: 1,
      in_progress: 1,
      fenced_out: 1,
      unavailable: 1,
      failed_retryable: 1, // the crash
      failed_permanent: 1,
    })
    expect(await sdk.total('oncely.server.request.duration', { 'oncely.operation': OPERATION })).toBe(12)
    for (const point of await sdk.points('oncely.server.requests')) {
      expect(Object.keys(point.attributes).sort()).toEqual([
        'oncely.operation',
        'oncely.outcome',
        'oncely.protocol',
      ])
      expect(point.attributes['oncely.protocol']).toBe(reservation)
    }
    expect(await sdk.total('oncely.server.duplicate.wait.duration')).toBe(1)
    // Under 'row' the paused key's winner took it over too; under 'lock' Postgres ended the paused transaction.
    expect(await sdk.total('oncely.server.takeovers')).toBe(row ? 2 : 1)
    expect(await sdk.total('oncely.server.active_executions')).toBe(0)
    // The unreachable store's two failed statements: the request's reservation, and the replay cache's replication
    // check that the request started.
    expect(await sdk.total('oncely.server.store.errors', { 'error.type': 'ECONNREFUSED' })).toBe(2)
    expect(await sdk.total('oncely.server.outbox.messages', { 'oncely.outbox.result': 'published' })).toBe(1)
    expect(await sdk.total('oncely.server.reaper.deleted')).toBe(1)
    expect(await sdk.total('oncely.server.reaper.duration')).toBe(1)

    // Spans: one per execution, the first a child of the HTTP span, carrying its outcome.
    const spans = sdk.spans()
    const executions = spans.filter((s) => s.name === `oncely ${OPERATION}`)
    expect(executions).toHaveLength(12)
    const firstSpan = executions[0]!
    expect(firstSpan.spanContext().traceId).toBe(httpSpan.traceId)
    expect(parentOf(firstSpan)).toBe(httpSpan.spanId)
    expect(firstSpan.instrumentationScope).toMatchObject({ name: '@oncely/server', version: VERSION })
    expect(firstSpan.attributes).toMatchObject({
      'oncely.outcome': 'executed',
      'oncely.replayed': false,
      'oncely.attempt': 1,
      'oncely.operation': OPERATION,
      'oncely.protocol': reservation,
    })
    expect(firstSpan.attributes).not.toHaveProperty('oncely.key')
    expect(firstSpan.attributes).not.toHaveProperty('oncely.scope')
    expect(firstSpan.events.map((e) => e.name)).toEqual(['oncely.reserved', 'oncely.handler.end'])
    expect(executions[1]!.attributes).toMatchObject({ 'oncely.outcome': 'replayed', 'oncely.replayed': true })
    expect(executions.map((s) => s.attributes['oncely.outcome']).sort()).toEqual(
      [
        ...Array(4).fill('executed'),
        ...Array(2).fill('replayed'),
        'mismatch',
        'in_progress',
        'fenced_out',
        'unavailable',
        'failed_retryable',
        'failed_permanent',
      ].sort(),
    )
    const crashed = executions.find((s) => s.attributes['oncely.outcome'] === 'failed_retryable')!
    expect(crashed.status.code).toBe(SpanStatusCode.ERROR)
    expect(crashed.events.some((e) => e.name === 'exception')).toBe(true)
    const takeover = executions.find((s) => s.events.some((e) => e.name === 'oncely.takeover'))
    expect(takeover?.attributes['oncely.attempt']).toBe(2)
    const fenced = executions.find((s) => s.attributes['oncely.outcome'] === 'fenced_out')!
    expect(fenced.events.some((e) => e.name === 'oncely.fenced_out')).toBe(true)
    expect(fenced.attributes['oncely.replayed']).toBe(true)
    expect(executions.find((s) => s.attributes['oncely.outcome'] === 'unavailable')!.status.code).toBe(
      SpanStatusCode.ERROR,
    )
    expect(spans.filter((s) => s.name === 'oncely reap')).toHaveLength(1)

    // The outbox: the message was enqueued under the first execution's span and published under a producer span,
    // a child of it, whose context the published message carries.
    const [message] = published
    const send = spans.find((s) => s.name === 'send payments.created')!
    expect(send.kind).toBe(SpanKind.PRODUCER)
    expect(send.spanContext().traceId).toBe(httpSpan.traceId)
    expect(parentOf(send)).toBe(firstSpan.spanContext().spanId)
    expect(message!.headers.traceparent).toBe(`00-${httpSpan.traceId}-${send.spanContext().spanId}-01`)
    const stored = await db.pool.query('SELECT headers FROM oncely.outbox WHERE id = $1', [message!.id])
    expect(stored.rows[0].headers.traceparent).toBe(
      `00-${httpSpan.traceId}-${firstSpan.spanContext().spanId}-01`,
    )
  })

  it('continues the trace in the inbox, and counts what the inbox told the broker', async () => {
    const [message] = published
    expect(message).toBeDefined()
    sdk.resetSpans()
    const { engine } = engineFor(db.pool, { reservation: 'lock' })
    const inbox = createInbox({ engine: instrumentEngine(engine, telemetry()), consumer: 'billing' })
    const consume = () =>
      inbox.consume({
        messageId: message!.id,
        topic: message!.topic,
        payload: message!.payload as object,
        headers: message!.headers,
        handler: async () => ({ invoiced: true }),
      })
    expect(await consume()).toMatchObject({ kind: 'processed' })
    expect(await consume()).toMatchObject({ kind: 'duplicate' })
    const processed = sdk.spans().filter((s) => s.name === 'process payments.created')
    expect(processed).toHaveLength(2)
    const parent = message!.headers.traceparent!.split('-')
    for (const span of processed) {
      expect(span.kind).toBe(SpanKind.CONSUMER)
      expect(span.spanContext().traceId).toBe(httpSpan.traceId)
      expect(parentOf(span)).toBe(parent[2])
      expect(span.attributes).toMatchObject({
        'messaging.destination.name': 'payments.created',
        'messaging.consumer.group.name': 'billing',
      })
    }
    expect(processed.map((s) => s.attributes['oncely.inbox.result'])).toEqual(['processed', 'duplicate'])
    const inboxCount = (result: string) =>
      sdk.total('oncely.server.inbox.messages', {
        'oncely.inbox.result': result,
        'messaging.consumer.group.name': 'billing',
      })
    expect(await inboxCount('processed')).toBe(1)
    expect(await inboxCount('duplicate')).toBe(1)
    published = []
  })
})

describe('what instrumentation must not do', () => {
  it('answers exactly as the bare engine, with no SDK registered at all', async () => {
    const bareEvents: EngineEvent[] = []
    const bare: Engine = createEngine({
      store: postgresStore({ pool: db.pool }),
      reservation,
      onEvent: (event) => bareEvents.push(event),
    })
    // The global providers: the API's no-ops (this file never registers them).
    const wrapped = instrumentEngine(bare)
    const key = freshKey('same')
    const tenant = freshKey('tenant')
    const a = await wrapped.execute(payRequest(tenant, key))
    const b = await wrapped.execute(payRequest(tenant, key))
    const c = await wrapped.execute(payRequest(tenant, key, { fingerprint: fingerprintOf({ x: 1 }) }))
    expect([a.kind, b.kind, c.kind]).toEqual(['executed', 'replayed', 'mismatch'])
    expect(bareEvents.map((e) => e.type)).toEqual(['reserved', 'executed', 'replayed', 'mismatch'])
    expect(await paymentsFor(db.pool, key)).toBe(1)
    expect(wrapped.options).toEqual(bare.options)
    expect(await wrapped.forget({ scope: tenant, operation: OPERATION, key })).toBe(true)
  })

  it('records the tenant and the key only when asked to', async () => {
    sdk.resetSpans()
    const { engine } = engineFor(db.pool)
    const tenant = freshKey('tenant')
    const key = freshKey('opt-in')
    const wrapped = instrumentEngine(engine, { ...telemetry(), recordScope: true, recordKey: true })
    await wrapped.execute(payRequest(tenant, key))
    const [span] = sdk.spans()
    expect(span!.attributes).toMatchObject({ 'oncely.scope': tenant, 'oncely.key': key })
    const points = await sdk.points('oncely.server.requests')
    expect(points.some((p) => p.attributes['oncely.scope'] === tenant)).toBe(true)
    expect(points.every((p) => !('oncely.key' in p.attributes))).toBe(true)
  })

  it('rethrows what the handler throws past the engine, and keeps the user’s onEvent whole', async () => {
    const events: EngineEvent[] = []
    const crash = new Error('boom')
    const { engine } = engineFor(db.pool, {
      onEvent: (event) => events.push(event),
      hooks: {
        afterReserve: () => {
          throw crash
        },
      },
    })
    const wrapped = instrumentEngine(engine, telemetry())
    await expect(wrapped.execute(payRequest(freshKey('t'), freshKey('k')))).rejects.toBe(crash)
    expect(events.map((e) => e.type)).toEqual(['reserved'])
  })

  it("keeps the engine's observer slot out of sight (not enumerable) and on its wrappers", () => {
    const engine = createEngine({ store: postgresStore({ pool: db.pool }) })
    expect(Object.getOwnPropertySymbols({ ...engine })).toEqual([])
    const wrapped = instrumentEngine(engine, telemetry())
    expect(Object.getOwnPropertySymbols({ ...wrapped })).toEqual([])
    // What a second layer of telemetry (or any oncely wrapper over this one) observes the engine through.
    expect(typeof (wrapped as Observable)[ENGINE_SIGNALS]).toBe('function')
  })

  it('checks its options', () => {
    expect(() => instrumentEngine({} as Engine)).toThrow(/`engine`/)
    expect(() =>
      instrumentEngine(createEngine({ store: postgresStore({ pool: db.pool }) }), {
        recordKey: 'yes' as never,
      }),
    ).toThrow(/`recordKey`/)
    expect(() =>
      instrumentEngine(createEngine({ store: postgresStore({ pool: db.pool }) }), {
        tracerProvider: {} as never,
      }),
    ).toThrow('Expected `tracerProvider` to be an OpenTelemetry TracerProvider.')
  })

  it('names its tracer and meter after the package version', () => {
    const manifest = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8'))
    expect(VERSION).toBe(manifest.version)
  })
})
