// What only the NestJS adapter has, on both of Nest's platforms over a real socket: the engine from Nest's
// dependency injection (forRoot, forRootAsync), `tx` through a parameter decorator, the app's own exception filters
// rendering what is stored and replayed, a handler that writes the response itself, the store checked at start-up,
// and options checked where they are given.
import 'reflect-metadata'
import type { AddressInfo } from 'node:net'
import {
  type ArgumentsHost,
  Body,
  Catch,
  Controller,
  type ExceptionFilter,
  Get,
  HttpException,
  type INestApplication,
  Module,
  Post,
  Res,
} from '@nestjs/common'
import { NestFactory } from '@nestjs/core'
import { ExpressAdapter } from '@nestjs/platform-express'
import { FastifyAdapter } from '@nestjs/platform-fastify'
import type { TestDatabase } from '@oncely/test-support'
import type pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { Engine } from '../../src/index.js'
import { migrate, postgresStore, StoreSetupError } from '../../src/index.js'
import {
  type ExecutionContext,
  IdempotencyContext,
  IdempotencyInterceptor,
  IdempotencyTx,
  Idempotent,
  ONCELY_ENGINE,
  OncelyModule,
} from '../../src/nestjs/index.js'
import { engineFor, freshKey, keyRecord, reservation, setupDatabase } from '../helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('nestjs')
})
afterAll(async () => {
  await db?.drop()
})

const POOL = Symbol('pool')
const effects = async (cart: string) =>
  (await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [cart])).rows[0].n as number

/** The app's own rendering of an HttpException: the page the layer must store and replay, not one of its own. */
@Catch(HttpException)
class ProblemFilter implements ExceptionFilter {
  catch(exception: HttpException, host: ArgumentsHost) {
    const response = host.switchToHttp().getResponse()
    const status = exception.getStatus()
    const body = JSON.stringify({ problem: exception.message, status })
    // Either platform's response object.
    if (typeof response.raw === 'object') {
      response.code(status).header('content-type', 'application/vnd.shop+json').send(body)
    } else {
      response.status(status).setHeader('content-type', 'application/vnd.shop+json')
      response.end(body)
    }
  }
}

interface Payment {
  cart: string
  amount: number
  outcome?: 'declined' | 'unavailable'
}

@Controller()
class PaymentsController {
  @Post('payments')
  @Idempotent()
  async create(@Body() body: Payment, @IdempotencyTx() tx: pg.PoolClient) {
    const { rows } = await tx.query(
      'INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, $3) RETURNING id',
      ['t', body.cart, body.amount],
    )
    // Thrown after the write: it must roll back with the attempt, whatever is stored.
    if (body.outcome === 'declined') throw new HttpException('card declined', 402)
    if (body.outcome === 'unavailable') throw new HttpException('provider down', 503)
    return { id: Number(rows[0].id), cart: body.cart }
  }

  /** Writes the response itself (Nest's library-specific mode): still held until the commit, and replayed. */
  @Post('accepted')
  @Idempotent()
  async accepted(
    @Body() body: Payment,
    @IdempotencyContext() idempotency: ExecutionContext,
    @Res() res: {
      raw?: unknown
      code?: (n: number) => { send(b: unknown): void }
      status?: (n: number) => { json(b: unknown): void }
    },
  ) {
    await idempotency.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, $3)', [
      't',
      body.cart,
      body.amount,
    ])
    const answer = { accepted: body.cart, attempt: idempotency.attempt }
    if (typeof res.raw === 'object') res.code!(202).send(answer)
    else res.status!(202).json(answer)
  }
}

type Platform = 'express' | 'fastify'

async function start(
  platform: Platform,
  module: unknown,
  {
    rawBody = true,
    bodyParser = true,
    global = false,
  }: { rawBody?: boolean; bodyParser?: boolean; global?: boolean } = {},
): Promise<{ app: INestApplication; url: string }> {
  const adapter = platform === 'express' ? new ExpressAdapter() : new FastifyAdapter()
  const app = await NestFactory.create(module as never, adapter, { rawBody, bodyParser, logger: false })
  // Bound globally as well as by @Idempotent(): it must still act once per request.
  if (global) app.useGlobalInterceptors(app.get(IdempotencyInterceptor))
  app.useGlobalFilters(new ProblemFilter())
  await app.listen(0, '127.0.0.1')
  const { port } = app.getHttpServer().address() as AddressInfo
  return { app, url: `http://127.0.0.1:${port}` }
}

const post = async (url: string, key: string, body: unknown) => {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: JSON.stringify(body),
  })
  return { status: response.status, headers: response.headers, text: await response.text() }
}

describe.each(['express', 'fastify'] as const)('NestJS on %s', (platform) => {
  let app: INestApplication
  let url: string
  let engine: Engine | undefined
  const errors: string[] = []
  beforeAll(async () => {
    // The engine made by a factory from another provider, as an app that owns its pool would.
    @Module({ providers: [{ provide: POOL, useValue: db.pool }], exports: [POOL] })
    class DatabaseModule {}
    @Module({
      imports: [
        OncelyModule.forRootAsync({
          imports: [DatabaseModule],
          inject: [POOL],
          useFactory: (pool: pg.Pool) => {
            engine = engineFor(pool).engine
            return {
              engine,
              tenant: () => 'tenant_nest',
              logger: { error: (_details: unknown, message: string) => errors.push(message) },
            }
          },
        }),
      ],
      controllers: [PaymentsController],
    })
    class AppModule {}
    ;({ app, url } = await start(platform, AppModule, { global: true }))
  })
  afterAll(async () => {
    await app?.close()
  })

  it('runs the handler with the transaction from @IdempotencyTx(), once, and replays its answer', async () => {
    const key = freshKey()
    const first = await post(`${url}/payments`, key, { cart: key, amount: 5 })
    const second = await post(`${url}/payments`, key, { cart: key, amount: 5 })
    expect(first.status).toBe(201)
    expect(second.status).toBe(201)
    expect(second.text).toBe(first.text)
    expect(second.headers.get('idempotent-replayed')).toBe('true')
    expect(await effects(key)).toBe(1)
    // The engine is a provider of the app, for `engine.forget()` and the like.
    expect(app.get(ONCELY_ENGINE)).toBe(engine)
  })

  it("a thrown 4xx HttpException is stored as the page the app's exception filter rendered, and replayed", async () => {
    const key = freshKey()
    const first = await post(`${url}/payments`, key, { cart: key, amount: 5, outcome: 'declined' })
    const replay = await post(`${url}/payments`, key, { cart: key, amount: 5, outcome: 'declined' })
    expect(first.status).toBe(402)
    expect(JSON.parse(first.text)).toEqual({ problem: 'card declined', status: 402 })
    expect(first.headers.get('content-type')).toMatch(/^application\/vnd\.shop\+json/)
    expect(replay.status).toBe(402)
    expect(replay.text).toBe(first.text)
    expect(replay.headers.get('content-type')).toBe(first.headers.get('content-type'))
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect((await keyRecord(db.pool, key))?.status).toBe('failed_permanent')
    // Thrown, not returned: the handler's write rolled back.
    expect(await effects(key)).toBe(0)
  })

  it('a thrown 5xx HttpException releases the key: the filter renders it, and the retry runs again', async () => {
    const key = freshKey()
    const first = await post(`${url}/payments`, key, { cart: key, amount: 5, outcome: 'unavailable' })
    expect(first.status).toBe(503)
    expect(JSON.parse(first.text)).toEqual({ problem: 'provider down', status: 503 })
    expect((await keyRecord(db.pool, key))?.status).toBe(
      reservation === 'row' ? 'failed_retryable' : undefined,
    )
    const retry = await post(`${url}/payments`, key, { cart: key, amount: 5, outcome: 'unavailable' })
    expect(retry.status).toBe(503)
    expect(retry.headers.get('idempotent-replayed')).toBeNull()
    expect(await effects(key)).toBe(0)
  })

  it('a handler that writes the response itself (@Res()) is held until the commit and replayed', async () => {
    const key = freshKey()
    const first = await post(`${url}/accepted`, key, { cart: key, amount: 1 })
    const replay = await post(`${url}/accepted`, key, { cart: key, amount: 1 })
    expect(first.status).toBe(202)
    expect(JSON.parse(first.text)).toEqual({ accepted: key, attempt: 1 })
    expect(replay.status).toBe(202)
    expect(replay.text).toBe(first.text)
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect(await effects(key)).toBe(1)
  })

  it('never runs an idempotent handler on a safe method: a 500 problem, logged once per route with the fix', async () => {
    let ran = 0
    @Controller()
    class SafeController {
      @Get('lookup')
      @Idempotent()
      lookup() {
        ran++
        return { ok: true }
      }
    }
    @Module({
      imports: [
        OncelyModule.forRoot({
          engine: engineFor(db.pool).engine,
          tenant: () => 't',
          logger: { error: (_d, m) => errors.push(m) },
        }),
      ],
      controllers: [SafeController],
    })
    class SafeModule {}
    const safe = await start(platform, SafeModule)
    try {
      const first = await fetch(`${safe.url}/lookup`, { headers: { 'idempotency-key': freshKey() } })
      const second = await fetch(`${safe.url}/lookup`)
      for (const res of [first, second]) {
        expect(res.status).toBe(500)
        expect(res.headers.get('content-type')).toBe('application/problem+json')
      }
      expect(ran).toBe(0)
      expect(
        errors.filter((line) => line.includes('safe methods are never idempotency-checked')),
      ).toHaveLength(1)
    } finally {
      await safe.app.close()
    }
  })

  it('refuses a body whose bytes Nest did not keep (no rawBody), once in the log with the fix', async () => {
    @Module({
      imports: [
        OncelyModule.forRoot({
          engine: engineFor(db.pool).engine,
          tenant: () => 't',
          logger: { error: (_d, m) => errors.push(m) },
        }),
      ],
      controllers: [PaymentsController],
    })
    class BareModule {}
    const bare = await start(platform, BareModule, { rawBody: false })
    try {
      const key = freshKey()
      const res = await post(`${bare.url}/payments`, key, { cart: key, amount: 1 })
      await post(`${bare.url}/payments`, freshKey(), { cart: key, amount: 1 })
      expect(res.status).toBe(500)
      expect(res.headers.get('content-type')).toBe('application/problem+json')
      expect(await keyRecord(db.pool, key)).toBeUndefined()
      expect(errors.filter((line) => line.includes('rawBody: true'))).toHaveLength(1)
    } finally {
      await bare.app.close()
    }
  })

  it.runIf(platform === 'express')(
    "without Nest's body parser (bodyParser: false) the layer reads the body itself: every refusal is a problem",
    async () => {
      @Module({
        imports: [OncelyModule.forRoot({ engine: engineFor(db.pool).engine, tenant: () => 't' })],
        controllers: [PaymentsController],
      })
      class OwnParserModule {}
      const own = await start(platform, OwnParserModule, { rawBody: false, bodyParser: false })
      try {
        const send = (key: string, body: string, type = 'application/json') =>
          fetch(`${own.url}/payments`, {
            method: 'POST',
            headers: { 'content-type': type, 'idempotency-key': key },
            body,
          })
        const key = freshKey()
        for (const [body, status, code] of [
          ['{"cart":', 400, 'invalid_json'],
          ['', 400, 'invalid_json'],
          [`{"cart":"${'x'.repeat(1_100_000)}"}`, 413, 'payload_too_large'],
        ] as const) {
          const res = await send(key, body)
          expect(res.status).toBe(status)
          expect(res.headers.get('content-type')).toBe('application/problem+json')
          expect(await res.json()).toMatchObject({ code })
        }
        expect(await keyRecord(db.pool, key)).toBeUndefined()
        const ok = await send(key, JSON.stringify({ cart: key, amount: 3 }))
        expect(ok.status).toBe(201)
        expect(await effects(key)).toBe(1)
      } finally {
        await own.app.close()
      }
    },
  )

  it('fails the start-up with a StoreSetupError when the store has no table', async () => {
    const schema = `nest_missing_${platform}`
    @Module({
      imports: [
        OncelyModule.forRoot({
          engine: engineFor(db.pool, { store: postgresStore({ pool: db.pool, schema }) }).engine,
          tenant: () => 't',
        }),
      ],
    })
    class MissingModule {}
    const adapter = platform === 'express' ? new ExpressAdapter() : new FastifyAdapter()
    const broken = await NestFactory.create(MissingModule, adapter, { logger: false })
    try {
      await expect(broken.init()).rejects.toBeInstanceOf(StoreSetupError)
    } finally {
      await broken.close()
    }
    // With its table, the same module starts.
    await migrate(db.pool, { schema })
    const fixed = await NestFactory.create(
      MissingModule,
      platform === 'express' ? new ExpressAdapter() : new FastifyAdapter(),
      { logger: false },
    )
    await fixed.init()
    await fixed.close()
  })
})

describe('options are checked where they are given, naming the bad one', () => {
  it('OncelyModule.forRoot()', () => {
    expect(() => OncelyModule.forRoot({ engine: {} as never, tenant: () => 't' })).toThrow(
      /`engine` of @oncely\/server\/nestjs/,
    )
    expect(() => OncelyModule.forRoot({ engine: engineFor(db.pool).engine, tenant: 'x' as never })).toThrow(
      /`tenant`/,
    )
    expect(() =>
      OncelyModule.forRoot({ engine: engineFor(db.pool).engine, tenant: () => 't', logger: {} as never }),
    ).toThrow(
      "Expected `logger` of @oncely/server/nestjs to be a logger with pino's `error(details, message)` method. Pass pino, or Nest's logger through it.",
    )
    expect(() => OncelyModule.forRootAsync({} as never)).toThrow(
      'Expected `useFactory` of OncelyModule.forRootAsync() to be a function.',
    )
    expect(() => OncelyModule.forRootAsync(undefined as never)).toThrow(
      'Expected the options of OncelyModule.forRootAsync() to be an object.',
    )
  })

  it('@Idempotent()', () => {
    expect(() => Idempotent({ leaseMs: -1 })).toThrow(/`leaseMs` of `@Idempotent\(\)`/)
    expect(() => Idempotent({ failOpen: true })).toThrow(/`failOpen` of `@Idempotent\(\)`/)
    expect(() => Idempotent({ wait: { timeoutMs: 0 } })).toThrow(
      'Expected `wait.timeoutMs` of `@Idempotent()` to be a positive integer, got 0.',
    )
  })

  it('OncelyModule.forRootAsync() at start-up', async () => {
    @Module({
      imports: [
        OncelyModule.forRootAsync({ useFactory: () => ({ engine: null as never, tenant: () => 't' }) }),
      ],
    })
    class BadModule {}
    await expect(
      NestFactory.create(BadModule, new ExpressAdapter(), { logger: false, abortOnError: false }),
    ).rejects.toThrow(/`engine` of @oncely\/server\/nestjs/)
  })
})
