// The in-process cache of finished responses: replays and 422s without a round trip, never past the record's expiry,
// bounded by count and bytes, and off when asked.
import { type TestDatabase, waitFor } from '@oncely/test-support'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { REPLICATION_CHECK_MS, REPLICATION_RECHECK_MS, ReplayCache } from '../src/engine/replay-cache.js'
import {
  createEngine,
  type Database,
  type Engine,
  type EngineEvent,
  type ExecutionContext,
  nodePostgres,
  postgresStore,
} from '../src/index.js'
import { type ReplicationRow, replicationCheck, replicationSafe } from '../src/store/replication.js'
import { createEngineForTesting } from '../src/testing/index.js'
import {
  countPayments,
  engineFor,
  fingerprintOf,
  freshKey,
  pooled,
  reservation,
  setupDatabase,
  sleep,
} from './helpers.js'

let db: TestDatabase
let checkouts = 0
beforeAll(async () => {
  db = await setupDatabase('replay_cache')
  db.pool.on('acquire', () => {
    checkouts++
  })
})
afterAll(() => db.drop())

const op = 'POST /v1/payments'

async function pay(ctx: ExecutionContext) {
  const { rows } = await ctx.tx.query(
    'INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 100) RETURNING id',
    [ctx.scope, ctx.key],
  )
  return { status: 201, body: { id: rows[0].id } }
}

const input = (key: string, body: unknown = { a: 1 }) => ({
  scope: 'cache',
  operation: op,
  key,
  fingerprint: fingerprintOf(body),
  handler: pay,
})

/** A `performance.now()` strictly later than any taken before: a check sent after what came before it. */
function tick(): number {
  const before = performance.now()
  let now = performance.now()
  while (now <= before) now = performance.now()
  return now
}

/** Runs `fn` and returns how many pool connections it checked out. */
async function checkoutsOf(fn: () => Promise<unknown>): Promise<number> {
  const before = checkouts
  await fn()
  return checkouts - before
}

/**
 * Replays `request` on `engine` until the replay cache answers it (no connection checked out), and returns that
 * answer. An entry answers only after a replication check sent after it was stored, which the engine asks for off
 * the request's path within REPLICATION_RECHECK_MS; until then the database answers (polled with a bound).
 */
async function replayFromCache<E extends Engine>(engine: E, request: ReturnType<typeof input>) {
  const deadline = Date.now() + 10_000
  for (;;) {
    let outcome: Awaited<ReturnType<E['execute']>> | undefined
    const used = await checkoutsOf(async () => {
      outcome = (await engine.execute(request)) as Awaited<ReturnType<E['execute']>>
    })
    if (used === 0) return outcome!
    if (Date.now() > deadline) throw new Error('the replay cache never answered')
    await sleep(20)
  }
}

/** `engine` once its replay cache answers: its first replication check has. */
async function warmed<E extends Engine>(engine: E): Promise<E> {
  const warm = { ...input(freshKey()), scope: 'cache-warm-up' }
  await engine.execute(warm)
  await replayFromCache(engine, warm)
  return engine
}

describe('replay cache', () => {
  it('answers a replay and a mismatch of a key this engine executed without touching the database', async () => {
    const { engine: cold, events } = engineFor(db.pool)
    const engine = await warmed(cold)
    events.length = 0
    const key = freshKey()
    const first = await engine.execute(input(key))
    expect(first.kind).toBe('executed')
    const replay = await replayFromCache(engine, input(key))
    expect(replay).toMatchObject({ kind: 'replayed', fencedOut: false })
    if (first.kind !== 'executed' || replay?.kind !== 'replayed') throw new Error('unreachable')
    expect(replay.response.body.equals(first.response.body)).toBe(true)
    expect(events.filter((event) => event.type === 'replayed').length).toBeGreaterThanOrEqual(1)

    let mismatch: unknown
    expect(
      await checkoutsOf(async () => {
        mismatch = await engine.execute(input(key, { a: 2 }))
      }),
    ).toBe(0)
    expect(mismatch).toEqual({ kind: 'mismatch' })
    expect(await countPayments(db.pool, 'cache')).toBeGreaterThanOrEqual(1)
  })

  it('learns a record another instance finished, after one round trip', async () => {
    const writer = engineFor(db.pool).engine
    const reader = await warmed(engineFor(db.pool).engine)
    const key = freshKey()
    await writer.execute(input(key))
    expect(await checkoutsOf(() => reader.execute(input(key)))).toBe(1)
    expect(await replayFromCache(reader, input(key))).toMatchObject({ kind: 'replayed' })
  })

  it('never answers past the record expiry: the key executes again once it expired', async () => {
    const engine = await warmed(engineFor(db.pool, { leaseMs: 1_000, retentionMs: 1_500 }).engine)
    const key = freshKey()
    await engine.execute(input(key))
    await replayFromCache(engine, input(key))
    await sleep(1_600)
    const again = await engine.execute(input(key))
    expect(again).toMatchObject({ kind: 'executed', attempt: 1 })
  })

  it('answers a record deleted behind its back for at most maxAgeMs; forget() on this instance evicts at once', async () => {
    // maxAgeMs long enough for the statements between learning the record and the replay below on a loaded machine,
    // and the server's confirmation not under test here (it would age over those statements too).
    const bounds = { maxAgeMs: 3_000, maxUnconfirmedMs: 60_000 }
    const writer = engineFor(db.pool, { replayCache: bounds }).engine
    const other = await warmed(engineFor(db.pool, { replayCache: bounds }).engine)
    const key = freshKey()
    await writer.execute(input(key))
    await other.execute(input(key)) // learns the record
    await replayFromCache(other, input(key))
    expect(await writer.forget({ scope: 'cache', operation: op, key })).toBe(true)
    // The instance that forgot runs the key again; the other still answers from its entry, until maxAgeMs.
    expect(await writer.peek(input(key))).toBeNull()
    expect(await checkoutsOf(() => other.execute(input(key)))).toBe(0)
    await sleep(3_050)
    expect(await other.peek(input(key))).toBeNull()
  })

  it('forgets everything it cached when the connections to the store are lost (a failover can lose committed records)', async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 2 })
    let lost = false
    pool.on('error', () => {
      lost = true
    })
    try {
      const engine = await warmed(engineFor(pool).engine)
      const key = freshKey()
      await engine.execute(input(key))
      await replayFromCache(engine, input(key)) // cached
      // Every connection idle: a connection lost in the middle of a statement (the engine's background replication
      // check) tells that statement, not the pool, and the pool's report is what this case waits for.
      await waitFor(
        'the pool to be idle',
        () => pool.totalCount > 0 && pool.idleCount === pool.totalCount,
        5_000,
      )
      // The database goes away under the pool (a primary crashing before its failover), and the record with it, as
      // asynchronous replication can lose a commit the standby never received.
      await db.pool.query(
        `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = ''`,
      )
      await db.pool.query('DELETE FROM oncely.idempotency_keys WHERE key = $1', [key])
      // The pool reports the loss of an idle connection (so the engine empties its cache) once its socket closes,
      // and drops it: the request below must not be handed a connection whose loss the pool has not read yet.
      await waitFor('the pool to lose its connections', () => lost && pool.totalCount === 0, 5_000)
      // Not a replay of a record the database no longer has: the key runs again.
      expect(await engine.execute(input(key))).toMatchObject({ kind: 'executed' })
    } finally {
      await pool.end()
    }
  })

  it('forgets everything it cached, and reports the store error, when a replication check fails', async () => {
    // The check is a statement like any other: its failure (here, the server going away under it) is a store error,
    // reported, and it empties the cache as every other store error does.
    const database = nodePostgres({ pool: db.pool, preparedStatements: !pooled })
    let failing = false
    const lost = Object.assign(new Error('terminating connection due to administrator command'), {
      code: '57P01',
    })
    const flaky: Database<pg.PoolClient> = {
      ...database,
      query: (statement) =>
        failing && statement === replicationCheck ? Promise.reject(lost) : database.query(statement),
    }
    const events: EngineEvent[] = []
    const engine = await warmed(
      createEngineForTesting({
        store: postgresStore({ database: flaky }),
        reservation,
        onEvent: (event) => events.push(event),
      }),
    )
    const key = freshKey()
    await engine.execute(input(key))
    await replayFromCache(engine, input(key))
    failing = true
    // A new entry makes the next check due within REPLICATION_RECHECK_MS; the next request asks for it.
    await engine.execute(input(freshKey()))
    await sleep(REPLICATION_RECHECK_MS + 50)
    await engine.execute(input(key))
    await waitFor(
      'the failed check to be reported',
      () => events.some((event) => event.type === 'store_error' && event.error === lost),
      5_000,
    )
    expect(await checkoutsOf(() => engine.execute(input(key)))).toBe(1)
    // Once the checks pass again, the cache answers again.
    failing = false
    expect(await replayFromCache(engine, input(key))).toMatchObject({ kind: 'replayed' })
  })

  it('is bounded by maxEntries (least recently used out first)', async () => {
    const engine = await warmed(engineFor(db.pool, { replayCache: { maxEntries: 2 } }).engine)
    const [a, b, c] = [freshKey(), freshKey(), freshKey()]
    for (const key of [a, b, c]) await engine.execute(input(key))
    await replayFromCache(engine, input(c))
    expect(await checkoutsOf(() => engine.execute(input(b)))).toBe(0)
    expect(await checkoutsOf(() => engine.execute(input(a)))).toBe(1)
  })

  it('is off with replayCache: false, and with unsafe.disableFencing', async () => {
    for (const options of [{ replayCache: false as const }, { unsafe: { disableFencing: true } }]) {
      const { engine } = engineFor(db.pool, options)
      const key = freshKey()
      await engine.execute(input(key))
      expect(await checkoutsOf(() => engine.execute(input(key)))).toBe(1)
    }
  })

  it('rejects bad bounds at construction, naming the option', () => {
    const store = postgresStore({ pool: db.pool })
    expect(() => createEngine({ store, replayCache: { maxEntries: 0 } })).toThrow(/replayCache\.maxEntries/)
    expect(() => createEngine({ store, replayCache: { maxBytes: 1.5 } })).toThrow(/replayCache\.maxBytes/)
    expect(() => createEngine({ store, replayCache: true as never })).toThrow(/`replayCache`/)
  })
})

/** A cache with generous bounds, or the ones given. */
const newCache = (bounds: Partial<ConstructorParameters<typeof ReplayCache>[0]> = {}) =>
  new ReplayCache({
    maxEntries: 10,
    maxBytes: 1_000_000,
    maxAgeMs: 60_000,
    maxUnconfirmedMs: 60_000,
    ...bounds,
  })

describe('replay cache and the server behind it', () => {
  it('answers from the cache only while the store confirmed its server lately; else asks the database', async () => {
    // A second: the cache answers only after a poll within that long of the statement before it, which a loaded
    // machine makes slow.
    const engine = await warmed(engineFor(db.pool, { replayCache: { maxUnconfirmedMs: 1_000 } }).engine)
    const key = freshKey()
    expect((await engine.execute(input(key))).kind).toBe('executed')
    await replayFromCache(engine, input(key)) // just confirmed
    await sleep(1_200) // nothing reached the database since: the next replay asks it, and confirms again
    expect(await checkoutsOf(() => engine.execute(input(key)))).toBe(1)
    // Then the cache answers again. (Polled: on a busy machine more than a second can pass between that statement
    // and the next replay, which then rightly asks the database once more.)
    await replayFromCache(engine, input(key))
  })

  it('never answers from an entry of another server: a restart or failover behind a pooler empties the cache', () => {
    const cache = newCache()
    const id = { scope: 's', operation: 'o', key: 'k' }
    const response = { status: 201, headers: {}, body: Buffer.from('ok') }
    cache.confirm(1, performance.now())
    cache.set(id, 'f', response, 60_000, performance.now(), Date.now(), 1)
    cache.replicationChecked(1, true, tick())
    expect(cache.get(id)).toBeDefined()
    cache.confirm(2, performance.now()) // the standby, promoted: the record may not exist there
    expect(cache.get(id)).toBeUndefined()
    // And a record read from the old server after the new one answered is not kept.
    cache.set(id, 'f', response, 60_000, performance.now(), Date.now(), 1)
    expect(cache.get(id)).toBeUndefined()
  })
})

describe('ReplayCache', () => {
  const SERVER = 1_700_000_000.5
  /** A cache that has just heard from SERVER. */
  const confirmed = (cache: ReplayCache) => {
    cache.confirm(SERVER, performance.now())
    return cache
  }
  /** A replication check sent after every entry so far was stored found SERVER safe. */
  const checked = (cache: ReplayCache) => cache.replicationChecked(SERVER, true, tick())
  const response = (bytes: number) => ({ status: 200, headers: {}, body: Buffer.alloc(bytes) })
  const id = (key: string) => ({ scope: 's', operation: 'o', key })
  const now = () => [performance.now(), Date.now()] as const

  it('is bounded by maxBytes, and skips a response larger than the whole budget', () => {
    const cache = confirmed(newCache({ maxEntries: 100, maxBytes: 1_000 }))
    cache.set(id('a'), 'f', response(400), 60_000, ...now(), SERVER)
    cache.set(id('b'), 'f', response(400), 60_000, ...now(), SERVER)
    cache.set(id('c'), 'f', response(400), 60_000, ...now(), SERVER)
    checked(cache)
    expect(cache.get(id('a'))).toBeUndefined()
    expect(cache.get(id('c'))).toBeDefined()
    cache.set(id('big'), 'f', response(2_000), 60_000, ...now(), SERVER)
    expect(cache.get(id('big'))).toBeUndefined()
  })

  it('counts the lifetime from before the statement was sent, on both clocks, and cuts it for drift', () => {
    const cache = confirmed(newCache())
    const [at, wall] = now()
    // Sent 10 s ago with 10 s left then: expired now, although a clock that started at receipt would disagree.
    cache.set(id('late'), 'f', response(1), 10_000, at - 10_000, wall, SERVER)
    cache.set(id('wall'), 'f', response(1), 10_000, at, wall - 10_000, SERVER)
    // 0.1% of 1,000 s is 1 s: an entry with 1,000.5 s left, sent 1,000 s ago, is already out.
    cache.set(id('drift'), 'f', response(1), 1_000_500, at - 1_000_000, wall - 1_000_000, SERVER)
    cache.set(id('fresh'), 'f', response(1), 10_000, at, wall, SERVER)
    checked(cache)
    expect(cache.get(id('late'))).toBeUndefined()
    expect(cache.get(id('wall'))).toBeUndefined()
    expect(cache.get(id('drift'))).toBeUndefined()
    expect(cache.get(id('fresh'))).toBeDefined()
    expect(cache.size).toBe(1)
  })

  it("keeps a body's bytes, never a view into the caller's buffer, and hands each replay a buffer of its own", () => {
    const cache = confirmed(newCache())
    // A slice of a handler's 1 MiB buffer, a small body from Node's shared pool (where Buffer.from puts it), a body
    // that owns its memory, and every byte value (no text encoding may touch them).
    const large = Buffer.alloc(1 << 20, 7)
    const pooled = Buffer.from('{"ok":true}')
    expect(pooled.buffer.byteLength).toBeGreaterThan(pooled.byteLength)
    const owned = Buffer.from(new Uint8Array([1, 2, 3]).buffer)
    const bytes = Buffer.from(Array.from({ length: 256 }, (_, i) => 255 - i))
    const bodies = { slice: large.subarray(10, 26), pooled, owned, bytes }
    const copies = Object.fromEntries(Object.entries(bodies).map(([key, body]) => [key, Buffer.from(body)]))
    for (const [key, body] of Object.entries(bodies))
      cache.set(id(key), 'f', { status: 201, headers: {}, body }, 60_000, ...now(), SERVER)
    checked(cache)
    // Written over after it was stored: a view would now replay other bytes.
    for (const body of Object.values(bodies)) body.fill(0)
    for (const key of Object.keys(bodies)) {
      const replayed = cache.get(id(key))!.response.body
      expect(replayed.equals(copies[key]!), key).toBe(true)
      // What one replay's reader does to its buffer, the next replay does not see.
      replayed.fill(1)
      expect(cache.get(id(key))!.response.body.equals(copies[key]!), key).toBe(true)
    }
  })

  it('keeps the records of one key under several scopes and operations apart, and bounds how many', () => {
    const cache = confirmed(newCache())
    const under = (scope: string, operation = 'POST /x') => ({ scope, operation, key: 'k' })
    // Clients of many tenants sending the same key: the first eight are kept, the rest answered by the database.
    for (let i = 0; i < 10; i++) cache.set(under(`t${i}`), `f${i}`, response(i), 60_000, ...now(), SERVER)
    checked(cache)
    for (let i = 0; i < 8; i++) expect(cache.get(under(`t${i}`))?.fingerprint).toBe(`f${i}`)
    expect(cache.get(under('t8'))).toBeUndefined()
    expect(cache.get(under('t9'))).toBeUndefined()
    expect(cache.get(under('t0', 'POST /y'))).toBeUndefined()
    expect(cache.size).toBe(8)
    // Forgetting the oldest, the newest and one between leaves the others answering.
    for (const scope of ['t0', 't7', 't3']) cache.delete(under(scope))
    expect(cache.size).toBe(5)
    for (const scope of ['t1', 't2', 't4', 't5', 't6']) expect(cache.get(under(scope))).toBeDefined()
    for (const scope of ['t0', 't7', 't3']) expect(cache.get(under(scope))).toBeUndefined()
    // Stored again, a record replaces its entry rather than adding one.
    cache.set(under('t1'), 'f1', response(1), 60_000, ...now(), SERVER)
    expect(cache.size).toBe(5)
  })

  it('keeps ids apart that would collide if concatenated', () => {
    const cache = confirmed(newCache())
    cache.set({ scope: 'ab', operation: 'c', key: 'd' }, 'f', response(1), 10_000, ...now(), SERVER)
    expect(cache.get({ scope: 'a', operation: 'bc', key: 'd' })).toBeUndefined()
  })

  it("answers only once a replication check found the server's commits safe on its standbys, for that server", () => {
    const cache = newCache()
    cache.confirm(SERVER, performance.now())
    expect(cache.replicationCheckDue(performance.now())).toBe(true)
    cache.set(id('a'), 'f', response(1), 60_000, ...now(), SERVER)
    expect(cache.get(id('a'))).toBeUndefined() // not checked yet: the database answers
    cache.replicationChecked(SERVER + 1, true, performance.now())
    expect(cache.get(id('a'))).toBeUndefined() // a check of another server says nothing of this one
    expect(cache.replicationCheckDue(performance.now())).toBe(true)
    cache.replicationChecked(SERVER, true, tick())
    expect(cache.replicationCheckDue(performance.now())).toBe(false)
    expect(cache.get(id('a'))).toBeDefined()
    // An entry stored after that check waits for the next one: a standby may have attached in between,
    // asynchronously. The next check is asked for within REPLICATION_RECHECK_MS.
    cache.set(id('later'), 'f', response(1), 60_000, ...now(), SERVER)
    expect(cache.get(id('later'))).toBeUndefined()
    expect(cache.replicationCheckDue(performance.now() + REPLICATION_RECHECK_MS + 1)).toBe(true)
    cache.replicationChecked(SERVER, true, tick())
    expect(cache.get(id('later'))).toBeDefined()
    // An asynchronous standby appears: what the cache holds may be lost in a failover, so it is dropped, and
    // nothing more is kept while the server streams to it.
    cache.replicationChecked(SERVER, false, performance.now())
    expect(cache.size).toBe(0)
    cache.set(id('b'), 'f', response(1), 60_000, ...now(), SERVER)
    expect(cache.size).toBe(0)
    // Checked again after REPLICATION_CHECK_MS.
    expect(cache.replicationCheckDue(performance.now() + REPLICATION_CHECK_MS)).toBe(true)
  })
})

describe('replicationSafe', () => {
  const row = (over: Partial<ReplicationRow>): ReplicationRow => ({
    server: 1,
    standbys: 1,
    unsynchronised: 0,
    standby_names: 'ANY 1 (standby)',
    synchronous_commit: 'on',
    ...over,
  })

  it('is safe with no standby, whatever the settings', () => {
    expect(replicationSafe(row({ standbys: 0, standby_names: '', synchronous_commit: 'off' }))).toBe(true)
  })

  it('is safe when commits wait for synchronous standbys and none streams asynchronously', () => {
    expect(replicationSafe(row({}))).toBe(true)
    expect(replicationSafe(row({ synchronous_commit: 'remote_apply' }))).toBe(true)
  })

  it('is unsafe with a standby commits do not wait for', () => {
    expect(replicationSafe(row({ standby_names: '' }))).toBe(false) // asynchronous replication
    expect(replicationSafe(row({ synchronous_commit: 'local' }))).toBe(false)
    expect(replicationSafe(row({ synchronous_commit: 'off' }))).toBe(false)
    expect(replicationSafe(row({ standbys: 2, unsynchronised: 1 }))).toBe(false) // one sync, one async or potential
  })
})

it('the replication check runs on Postgres and finds this server safe (it streams to no standby)', async () => {
  const { rows } = await db.pool.query<ReplicationRow>(replicationCheck.text)
  expect(rows[0]).toMatchObject({ standbys: 0, unsynchronised: 0 })
  expect(typeof rows[0]!.server).toBe('number')
  expect(replicationSafe(rows[0]!)).toBe(true)
})

it.skipIf(pooled)(
  'prepares the replication check once per connection instead of planning it on every check',
  async () => {
    // One connection, so the checks and the question below share one session's prepared statements. Unnamed, the
    // check was planned on every run: about 1.4 ms of Postgres's time, ten times a second under steady traffic.
    const pool = new pg.Pool({ connectionString: db.url, max: 1 })
    pool.on('error', () => {})
    try {
      const { engine } = engineFor(pool)
      // The first request asks for a check; each later one, sent once REPLICATION_RECHECK_MS passed after a new
      // entry, asks for another.
      for (let i = 0; i < 3; i++) {
        await engine.execute(input(freshKey()))
        await sleep(REPLICATION_RECHECK_MS + 20)
      }
      const runs = async () => {
        const { rows } = await pool.query<{ runs: string }>(
          `SELECT generic_plans + custom_plans AS runs FROM pg_prepared_statements
         WHERE NOT from_sql AND statement LIKE '%FROM pg_stat_replication%'`,
        )
        return rows.length === 1 ? Number(rows[0]!.runs) : 0
      }
      await waitFor(
        'the replication check to run twice from one preparation',
        async () => (await runs()) >= 2,
        5_000,
      )
    } finally {
      await pool.end()
    }
  },
)
