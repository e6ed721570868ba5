// The client's OpenTelemetry instrumentation on the SDK's in-memory exporters: a span per intent with one child per
// attempt, each attempt carrying its own traceparent; exact metric counts; and end to end, the server's spans join
// the client's trace (a real Fastify server with @oncely/server/otel behind OpenTelemetry's HTTP instrumentation).

import { readFileSync } from 'node:fs'
import { createServer, type IncomingMessage } from 'node:http'
import type { AddressInfo } from 'node:net'
import { context, propagation, SpanKind, SpanStatusCode } from '@opentelemetry/api'
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks'
import { W3CTraceContextPropagator } from '@opentelemetry/core'
import { HttpInstrumentation } from '@opentelemetry/instrumentation-http'
import {
  AggregationTemporality,
  DataPointType,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics'
import {
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
  TracerProvider,
} from '@opentelemetry/sdk-trace'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createClient, memoryStore } from '../src/index.js'
import { instrumentClient, VERSION } from '../src/otel/index.js'

// The HTTP instrumentation patches node:http, so it is enabled before anything below loads Fastify.
const spanExporter = new InMemorySpanExporter()
const tracerProvider = new TracerProvider({
  spanProcessors: [new SimpleSpanProcessor({ exporter: spanExporter })],
})
const http = new HttpInstrumentation()
http.setTracerProvider(tracerProvider)
http.enable()
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable())
propagation.setGlobalPropagator(new W3CTraceContextPropagator())
const metricExporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE)
const reader = new PeriodicExportingMetricReader({
  exporter: metricExporter,
  exportIntervalMillis: 3_600_000,
})
const meterProvider = new MeterProvider({ readers: [reader] })
const telemetry = { tracerProvider, meterProvider }

const parentOf = (span: ReadableSpan) =>
  (span as ReadableSpan & { parentSpanContext?: { spanId: string } }).parentSpanContext?.spanId
const ours = () =>
  spanExporter.getFinishedSpans().filter((s) => s.instrumentationScope.name === '@oncely/client')

async function total(name: string, match: Record<string, unknown> = {}): Promise<number> {
  metricExporter.reset()
  await reader.forceFlush()
  let sum = 0
  for (const resource of metricExporter.getMetrics())
    for (const scope of resource.scopeMetrics)
      for (const metric of scope.metrics) {
        if (metric.descriptor.name !== name) continue
        for (const point of metric.dataPoints) {
          if (!Object.entries(match).every(([k, v]) => point.attributes[k] === v)) continue
          sum +=
            metric.dataPointType === DataPointType.HISTOGRAM
              ? (point.value as { count: number }).count
              : Number(point.value)
        }
      }
  return sum
}

afterAll(async () => {
  http.disable()
  await tracerProvider.shutdown()
  await meterProvider.shutdown()
})

describe('spans and metrics of one intent', () => {
  // Answers 503 with Retry-After to the first attempt of each key, then 201; records every attempt's headers.
  const seen: IncomingMessage['headers'][] = []
  let url = ''
  const server = createServer((request, response) => {
    request.resume()
    request.on('end', () => {
      seen.push(request.headers)
      const attempt = request.headers['oncely-attempt']
      if (attempt === '1') {
        response.writeHead(503, { 'retry-after': '0', 'content-type': 'application/problem+json' })
        response.end('{"status":503}')
        return
      }
      response.writeHead(201, { 'content-type': 'application/json' })
      response.end('{"ok":true}')
    })
  })
  beforeAll(async () => {
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  })
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())))

  it('gives the intent a span with one child per attempt, each sending its own traceparent', async () => {
    spanExporter.reset()
    const client = instrumentClient(
      createClient,
      { baseUrl: url, store: memoryStore(), retry: { minDelayMs: 1, maxDelayMs: 1 } },
      telemetry,
    )
    const response = await client.request({ path: '/v1/payments', json: { amount: 100 } })
    expect(response).toMatchObject({ status: 201, attempts: 2, source: 'network' })

    const spans = ours()
    const intent = spans.find((s) => s.name === 'oncely.intent POST')!
    const attempts = spans.filter((s) => s.kind === SpanKind.CLIENT)
    expect(intent.instrumentationScope).toMatchObject({ name: '@oncely/client', version: VERSION })
    expect(intent.attributes).toMatchObject({
      'oncely.outcome': 'settled',
      'oncely.replayed': false,
      'oncely.attempts': 2,
      'http.response.status_code': 201,
    })
    expect(intent.attributes).not.toHaveProperty('oncely.key')
    expect(intent.events.map((e) => e.name)).toEqual(['oncely.retry'])
    expect(attempts.map((s) => s.attributes['oncely.attempt'])).toEqual([1, 2])
    expect(attempts.map((s) => s.attributes['http.response.status_code'])).toEqual([503, 201])
    expect(attempts[0]!.status.code).toBe(SpanStatusCode.ERROR)
    const mine = seen.slice(-2)
    attempts.forEach((span, i) => {
      expect(parentOf(span)).toBe(intent.spanContext().spanId)
      expect(mine[i]!.traceparent).toBe(`00-${intent.spanContext().traceId}-${span.spanContext().spanId}-01`)
      expect(mine[i]!['idempotency-key']).toBe(response.key)
    })

    expect(await total('oncely.client.attempts')).toBe(2)
    expect(await total('oncely.client.retries', { 'oncely.retry.reason': 'status 503' })).toBe(1)
    expect(await total('oncely.client.retry.delay', { 'oncely.retry_after': true })).toBe(1)
    expect(await total('oncely.client.write_ahead.duration')).toBe(1)
    expect(await total('oncely.client.intents', { 'oncely.outcome': 'settled' })).toBe(1)
    expect(await total('oncely.client.intents.pending', { 'oncely.intent.state': 'pending' })).toBe(0)
    await client.close()
  })

  it('traces a resumed intent, counts the resume and shows pending intents', async () => {
    spanExporter.reset()
    const store = memoryStore()
    const now = Date.now()
    await store.set({
      format: 1,
      id: 'left-behind',
      key: 'left-behind',
      method: 'POST',
      url: `${url}/v1/payments`,
      headers: { 'content-type': 'application/json' },
      body: { encoding: 'utf8', data: '{"amount":1}' },
      createdAt: now,
      expiresAt: now + 60_000,
      attempts: 1,
      version: 1,
      state: 'pending',
    })
    const client = instrumentClient(createClient, { baseUrl: url, store, resumeOnOnline: false }, telemetry)
    expect(await total('oncely.client.intents.pending', { 'oncely.intent.state': 'pending' })).toBe(1)
    const [outcome] = await client.resume()
    expect(outcome).toMatchObject({ outcome: 'settled' })
    expect(await total('oncely.client.resumes', { 'oncely.outcome': 'settled' })).toBe(1)
    const intent = ours().find((s) => s.name === 'oncely.intent POST')!
    expect(intent.attributes).toMatchObject({ 'oncely.resumed': true, 'oncely.outcome': 'settled' })
    expect(
      ours()
        .filter((s) => s.kind === SpanKind.CLIENT)
        .every((s) => parentOf(s) === intent.spanContext().spanId),
    ).toBe(true)
    await client.close()
  })

  it('answers exactly as the bare client, with no SDK at all', async () => {
    const seenBefore = seen.length
    const client = instrumentClient(createClient, {
      baseUrl: url,
      store: memoryStore(),
      retry: { minDelayMs: 1, maxDelayMs: 1 },
    })
    const response = await client.request({ path: '/v1/payments', json: { amount: 1 } })
    expect(response).toMatchObject({ status: 201, attempts: 2 })
    // The global propagator is registered in this file, but no span records: no traceparent goes out.
    expect(seen.slice(seenBefore).every((headers) => headers.traceparent === undefined)).toBe(true)
    await client.close()
  })

  it('checks its arguments and names its scope after the package version', () => {
    expect(() => instrumentClient(undefined as never, { baseUrl: url })).toThrow(/`create`/)
    expect(() => instrumentClient(createClient, { baseUrl: url }, { recordKey: 1 as never })).toThrow(
      /`recordKey`/,
    )
    const manifest = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'))
    expect(VERSION).toBe(manifest.version)
  })
})

describe('end to end', () => {
  it('joins the client span and the server span by trace id', async () => {
    const { createTestDatabase } = await import('@oncely/test-support')
    const { createEngine, migrate, postgresStore } = await import('@oncely/server')
    const { fastifyIdempotency } = await import('@oncely/server/fastify')
    const { instrumentEngine } = await import('@oncely/server/otel')
    const { default: Fastify } = await import('fastify')
    const db = await createTestDatabase('client-otel')
    await migrate(db.pool)
    const engine = instrumentEngine(createEngine({ store: postgresStore({ pool: db.pool }) }), telemetry)
    const app = Fastify({ logger: false })
    await app.register(fastifyIdempotency, { engine, tenant: () => 'tenant_1' })
    app.post('/v1/payments', { config: { idempotency: { required: true } } }, async (_request, reply) =>
      reply.code(201).send({ ok: true }),
    )
    await app.listen({ port: 0, host: '127.0.0.1' })
    try {
      spanExporter.reset()
      const client = instrumentClient(
        createClient,
        { baseUrl: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`, store: memoryStore() },
        telemetry,
      )
      const response = await client.request({ path: '/v1/payments', json: { amount: 5 } })
      expect(response.status).toBe(201)
      await client.close()

      const spans = spanExporter.getFinishedSpans()
      const intent = spans.find((s) => s.name === 'oncely.intent POST')!
      const attempt = spans.find(
        (s) => s.instrumentationScope.name === '@oncely/client' && s.kind === SpanKind.CLIENT,
      )!
      const execution = spans.find((s) => s.instrumentationScope.name === '@oncely/server')!
      const incoming = spans.find(
        (s) => s.kind === SpanKind.SERVER && s.instrumentationScope.name.includes('instrumentation-http'),
      )!
      expect(execution.name).toBe('oncely POST /v1/payments')
      expect(execution.attributes).toMatchObject({ 'oncely.outcome': 'executed' })
      // One trace: the client's intent, its attempt, the server's HTTP span, the engine's execution.
      for (const span of [attempt, incoming, execution])
        expect(span.spanContext().traceId).toBe(intent.spanContext().traceId)
      expect(parentOf(execution)).toBe(incoming.spanContext().spanId)
      // The HTTP instrumentation's client span (Node's fetch is not node:http, so there is none) or ours is its parent.
      expect(parentOf(incoming)).toBe(attempt.spanContext().spanId)
    } finally {
      await app.close()
      await db.drop()
    }
  })
})
