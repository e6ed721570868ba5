// Behind a real PgBouncer in transaction mode (the default pool mode of most managed poolers): an engine left with
// prepared statements on is recognised at its first failure, which names the cause and the setting once, and goes
// on with statements that are not prepared. The requests that met it are tried again at once (nothing was reserved
// yet): none is answered 503 for it, and nothing runs twice.
import { type PgBouncer, pgbouncerPath, startPgBouncer, type TestDatabase } from '@oncely/test-support'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createEngine, isStoreSetupError, type Outcome, postgresStore } from '../src/index.js'
import { freshKey, paymentsFor, payRequest, reservation, setupDatabase, sleep } from './helpers.js'

const missing = pgbouncerPath() ? undefined : 'pgbouncer is not installed (Debian: apt-get install pgbouncer)'
if (missing && process.env.CI) throw new Error(missing)

describe.skipIf(missing)(`behind PgBouncer in transaction mode (reservation: '${reservation}')`, () => {
  let db: TestDatabase
  let bouncer: PgBouncer
  let pool: pg.Pool
  beforeAll(async () => {
    db = await setupDatabase('pooler')
    bouncer = await startPgBouncer({ poolSize: 4 })
    pool = new pg.Pool({ connectionString: bouncer.url(db.name), max: 20 })
    pool.on('error', () => {})
  })
  afterAll(async () => {
    await pool?.end()
    await bouncer?.stop()
    await db?.drop()
  })

  it('detects it from prepared statements gone missing, names the fix once, and answers no request 503 for it', async () => {
    const errors: unknown[] = []
    const engine = createEngine({
      store: postgresStore({ pool }), // preparedStatements left at its default, as a new user would
      reservation,
      onEvent: (event) => {
        if (event.type === 'store_error') errors.push(event.error)
      },
    })
    const keys = Array.from({ length: 5 }, () => freshKey('pooled'))
    const first: Outcome[] = await Promise.all(
      Array.from({ length: 40 }, (_, i) => engine.execute(payRequest('pooled', keys[i % keys.length]!))),
    )
    expect(first.filter((o) => o.kind === 'unavailable')).toEqual([])
    const error = errors.find(isStoreSetupError)
    expect(error?.message).toContain('pooler in transaction mode')
    expect(error?.message).toContain('preparedStatements: false')
    // Retried, every key is done exactly once.
    for (const key of keys) {
      let outcome: Outcome | undefined
      for (
        let attempt = 0;
        attempt < 50 && outcome?.kind !== 'executed' && outcome?.kind !== 'replayed';
        attempt++
      ) {
        if (outcome?.kind === 'in_progress') await sleep(outcome.retryAfterMs / 10)
        outcome = await engine.execute(payRequest('pooled', key))
      }
      expect(outcome?.kind).toMatch(/^(executed|replayed)$/)
      expect(await paymentsFor(db.pool, key)).toBe(1)
    }
    // From then on nothing fails: 40 new keys, all executed.
    const later = await Promise.all(
      Array.from({ length: 40 }, () => engine.execute(payRequest('pooled', freshKey()))),
    )
    expect(later.map((o) => o.kind)).toEqual(Array(40).fill('executed'))
  })
})
