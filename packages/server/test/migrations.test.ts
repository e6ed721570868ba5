import { readdirSync, readFileSync } from 'node:fs'
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createEngine, migrate, migrations, postgresStore, renderMigrations } from '../src/index.js'
import { MIGRATION_TEMPLATES } from '../src/store/migration-sql.js'

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('migrations')
})
afterAll(() => db.drop())

const dir = new URL('../migrations/', import.meta.url)

describe('migrations', () => {
  it('embeds exactly the numbered .sql files (so built and bundled copies need no file system)', () => {
    const files = readdirSync(dir)
      .filter((name) => name.endsWith('.sql'))
      .sort()
    expect(files.map((name) => name.replace(/\.sql$/, ''))).toEqual(MIGRATION_TEMPLATES.map((m) => m.name))
    MIGRATION_TEMPLATES.forEach((m, i) => {
      expect(m.id).toBe(i + 1)
      expect(m.name.startsWith(String(m.id).padStart(3, '0'))).toBe(true)
      expect(readFileSync(new URL(`${m.name}.sql`, dir), 'utf8')).toBe(m.sql)
    })
  })

  it('exports rendered SQL for other migration tools', () => {
    expect(migrations[0]?.sql).toContain('CREATE TABLE IF NOT EXISTS "oncely"."idempotency_keys"')
    const custom = renderMigrations({ schema: 'billing', table: 'keys"x' })
    expect(custom[0]?.sql).toContain('"billing"."keys""x"')
    expect(custom[0]?.sql).not.toContain('{{')
  })

  it('applies once when several instances migrate at the same moment', async () => {
    const results = await Promise.all(Array.from({ length: 5 }, () => migrate(db.pool, { schema: 'multi' })))
    expect(results.filter((r) => r.applied.length > 0)).toHaveLength(1)
    expect((await migrate(db.pool, { schema: 'multi' })).applied).toEqual([])
    const { rows } = await db.pool.query(
      'SELECT table_name, id, name FROM multi.oncely_migrations ORDER BY id',
    )
    expect(rows).toEqual(migrations.map((m) => ({ table_name: 'idempotency_keys', id: m.id, name: m.name })))
  })

  it('supports a custom schema and table end to end', async () => {
    await migrate(db.pool, { schema: 'Weird Schema', table: 'keys' })
    const engine = createEngine({
      store: postgresStore({ pool: db.pool, schema: 'Weird Schema', table: 'keys' }),
    })
    const outcome = await engine.execute({
      scope: 's',
      operation: 'o',
      key: 'k',
      fingerprint: 'f',
      handler: async () => ({ status: 201, body: 'ok' }),
    })
    expect(outcome.kind).toBe('executed')
    const { rows } = await db.pool.query(`SELECT status FROM "Weird Schema".keys`)
    expect(rows).toEqual([{ status: 'succeeded' }])
  })
})

describe('003: the outbox keyed by tenant', () => {
  it('moves an existing outbox to keys with the scope, keeping its rows, and runs again as a no-op', async () => {
    // A database migrated by an earlier version: 001 and 002 only, with a message in its outbox.
    await db.pool.query('CREATE SCHEMA before_003')
    for (const m of renderMigrations({ schema: 'before_003' }).slice(0, 2)) await db.pool.query(m.sql)
    await db.pool.query(
      `CREATE TABLE before_003.oncely_migrations (table_name text NOT NULL, id integer NOT NULL, name text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (table_name, id));
       INSERT INTO before_003.oncely_migrations (table_name, id, name)
         VALUES ('idempotency_keys', 1, '001_create_idempotency_keys'), ('idempotency_keys', 2, '002_create_outbox');
       INSERT INTO before_003.outbox (id, topic, payload) VALUES ('6f1c0d8e-0000-4000-8000-000000000001', 't', '{}')`,
    )
    expect((await migrate(db.pool, { schema: 'before_003' })).applied).toEqual([
      '003_outbox_scope',
      '004_outbox_claimed_by',
    ])
    // A second key table in the same schema runs 003 and 004 again: nothing changes.
    expect((await migrate(db.pool, { schema: 'before_003', table: 'inbox_keys' })).applied).toHaveLength(4)
    const { rows } = await db.pool.query('SELECT id, scope, topic FROM before_003.outbox')
    expect(rows).toEqual([{ id: '6f1c0d8e-0000-4000-8000-000000000001', scope: '', topic: 't' }])
    const keys = await db.pool.query<{ name: string; def: string }>(
      `SELECT indexrelid::regclass::text AS name, pg_get_indexdef(indexrelid) AS def FROM pg_index
       WHERE indrelid = 'before_003.outbox'::regclass AND indisunique ORDER BY 1`,
    )
    expect(keys.rows.map((k) => k.def.replace(/^.* USING btree /, ''))).toEqual([
      '(scope, id)',
      '(scope, seq)',
    ])
    // The same id under two scopes is two messages; under one, still refused.
    await db.pool.query(
      `INSERT INTO before_003.outbox (id, scope, topic, payload) VALUES ('6f1c0d8e-0000-4000-8000-000000000001', 'other', 't', '{}')`,
    )
    await expect(
      db.pool.query(
        `INSERT INTO before_003.outbox (id, scope, topic, payload) VALUES ('6f1c0d8e-0000-4000-8000-000000000001', 'other', 't', '{}')`,
      ),
    ).rejects.toMatchObject({ code: '23505' })
  })
})

describe('engine.verify()', () => {
  it('names the missing table and the fix, and resolves once migrated', async () => {
    const engine = createEngine({
      store: postgresStore({ pool: db.pool, schema: 'unmigrated', table: 'keys' }),
    })
    const error = await engine.verify().catch((e: unknown) => e)
    expect(error).toMatchObject({ name: 'StoreSetupError', code: '42P01' })
    expect((error as Error).message).toBe(
      'The idempotency table "unmigrated"."keys" does not exist. Run `await migrate(pool, { schema: "unmigrated", table: "keys" })` from \'@oncely/server\' at start-up, or apply renderMigrations({ schema: "unmigrated", table: "keys" }) with your migration tool.',
    )
    await migrate(db.pool, { schema: 'unmigrated', table: 'keys' })
    await expect(engine.verify()).resolves.toBeUndefined()
  })

  it('tells an out-of-date table from a missing one', async () => {
    await db.pool.query('CREATE SCHEMA old; CREATE TABLE old.idempotency_keys (scope text)')
    const engine = createEngine({ store: postgresStore({ pool: db.pool, schema: 'old' }) })
    await expect(engine.verify()).rejects.toMatchObject({
      name: 'StoreSetupError',
      code: '42703',
      message: expect.stringContaining('is older than this version of @oncely/server'),
    })
  })
})
