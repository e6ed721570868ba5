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
    expect(rows).toEqual(
      migrations.map((m) => ({
        table_name: m.appliesTo === 'table' ? 'idempotency_keys' : '',
        id: m.id,
        name: m.name,
      })),
    )
  })

  it('runs a key-table migration once per key table and a schema-wide one once per schema', async () => {
    expect(migrations.map((m) => [m.name, m.appliesTo])).toEqual([
      ['001_create_idempotency_keys', 'table'],
      ['002_create_outbox', 'schema'],
      ['003_outbox_scope', 'schema'],
      ['004_outbox_claimed_by', 'schema'],
      ['005_drop_key_checks', 'table'],
    ])
    expect((await migrate(db.pool, { schema: 'shared', table: 'a' })).applied).toHaveLength(5)
    expect((await migrate(db.pool, { schema: 'shared', table: 'b' })).applied).toEqual([
      '001_create_idempotency_keys',
      '005_drop_key_checks',
    ])
    const { rows } = await db.pool.query(
      'SELECT table_name, id FROM shared.oncely_migrations ORDER BY id, table_name',
    )
    expect(rows.map((row) => `${row.table_name}:${row.id}`)).toEqual([
      'a:1',
      'b:1',
      ':2',
      ':3',
      ':4',
      'a:5',
      'b:5',
    ])
  })

  it('moves a ledger that recorded the outbox per key table forward without running the outbox again', async () => {
    // What versions before `appliesTo` left: 001 to 004 recorded under each of two key tables.
    await db.pool.query('CREATE SCHEMA per_table')
    for (const table of ['a', 'b'])
      for (const m of renderMigrations({ schema: 'per_table', table }).slice(0, 4)) await db.pool.query(m.sql)
    await db.pool.query(
      `CREATE TABLE per_table.oncely_migrations (table_name text NOT NULL, id integer NOT NULL, name text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (table_name, id));
       INSERT INTO per_table.oncely_migrations (table_name, id, name)
         SELECT t, m.id, m.name FROM unnest(ARRAY['a', 'b']) AS t,
           (VALUES (1, '001_create_idempotency_keys'), (2, '002_create_outbox'), (3, '003_outbox_scope'),
                   (4, '004_outbox_claimed_by')) AS m(id, name)`,
    )
    // The outbox's own statements would fail now if they ran: its old primary key is gone, and 003 drops it by name.
    await db.pool.query('ALTER TABLE per_table.outbox RENAME TO outbox_kept')
    await db.pool.query('CREATE VIEW per_table.outbox AS SELECT * FROM per_table.outbox_kept')
    expect((await migrate(db.pool, { schema: 'per_table', table: 'a' })).applied).toEqual([
      '005_drop_key_checks',
    ])
    expect((await migrate(db.pool, { schema: 'per_table', table: 'c' })).applied).toEqual([
      '001_create_idempotency_keys',
      '005_drop_key_checks',
    ])
    expect((await migrate(db.pool, { schema: 'per_table', table: 'b' })).applied).toEqual([
      '005_drop_key_checks',
    ])
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
      '005_drop_key_checks',
    ])
    // A second key table in the same schema runs its own migrations only.
    expect((await migrate(db.pool, { schema: 'before_003', table: 'inbox_keys' })).applied).toEqual([
      '001_create_idempotency_keys',
      '005_drop_key_checks',
    ])
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

describe('005: the key table without CHECK constraints', () => {
  const checks = async (schema: string, table: string) =>
    (
      await db.pool.query(
        `SELECT conname FROM pg_constraint WHERE conrelid = (quote_ident($1) || '.' || quote_ident($2))::regclass
           AND contype = 'c' ORDER BY 1`,
        [schema, table],
      )
    ).rows.map((row) => row.conname as string)

  it('drops the checks of a table created by 001, whatever its name', async () => {
    // 60 bytes: Postgres shortens the table's part of the constraints' names; a multi-byte name is cut by characters.
    for (const table of ['keys', 'k'.repeat(60), `x${'\u00e9'.repeat(29)}`]) {
      await db.pool.query('CREATE SCHEMA IF NOT EXISTS checks')
      const [create, , , , drop] = renderMigrations({ schema: 'checks', table })
      await db.pool.query(create!.sql)
      expect(await checks('checks', table)).toHaveLength(2)
      await db.pool.query(drop!.sql)
      expect(await checks('checks', table)).toEqual([])
    }
  })

  it('leaves the engine to refuse what the checks refused: a key over 255 characters', async () => {
    await migrate(db.pool, { schema: 'checked' })
    expect(await checks('checked', 'idempotency_keys')).toEqual([])
    const engine = createEngine({ store: postgresStore({ pool: db.pool, schema: 'checked' }) })
    const handler = async () => ({ status: 201, body: 'ok' })
    const input = (key: string) => ({ scope: 's', operation: 'o', key, fingerprint: 'f', handler })
    await expect(engine.execute(input('k'.repeat(256)))).rejects.toThrow(
      new TypeError('Expected `key` to have at most 255 characters, got 256.'),
    )
    // Characters, not UTF-16 units: 255 emoji are a valid key.
    expect((await engine.execute(input('\u{1F600}'.repeat(255)))).kind).toBe('executed')
    const { rows } = await db.pool.query('SELECT char_length(key) AS n FROM checked.idempotency_keys')
    expect(rows).toEqual([{ n: 255 }])
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
