import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { describe, expect, it } from 'vitest'

const fixture = (name: string) => fileURLToPath(new URL(`fixtures/${name}`, import.meta.url))

/** Imports `entries` in a fresh Node process and returns every specifier it resolved. */
function specifiersLoadedBy(entries: string[]): string[] {
  const dir = mkdtempSync(join(tmpdir(), 'oncely-imports-'))
  const log = join(dir, 'imports.log')
  try {
    const register = `import { register } from 'node:module'; register(${JSON.stringify(new URL(`file://${fixture('record-imports.mjs')}`).href)})`
    const result = spawnSync(
      process.execPath,
      [
        '--conditions=@oncely/source',
        '--import',
        `data:text/javascript,${encodeURIComponent(register)}`,
        '--import',
        'tsx',
        fixture('import-entries.ts'),
        ...entries,
      ],
      {
        env: { ...process.env, IMPORT_LOG: log },
        encoding: 'utf8',
        cwd: fileURLToPath(new URL('../..', import.meta.url)),
      },
    )
    expect(result.status, result.stderr).toBe(0)
    return readFileSync(log, 'utf8').trim().split('\n')
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

const optional = (specifier: string) => specifier === 'ioredis' || specifier.startsWith('@nats-io/')
const telemetry = (specifier: string) => specifier.startsWith('@opentelemetry/')
const frameworks = (specifier: string) =>
  ['fastify', 'fastify-plugin', 'express', 'hono', 'koa', 'rxjs'].includes(specifier) ||
  specifier.startsWith('@hono/') ||
  specifier.startsWith('@koa/') ||
  specifier.startsWith('@nestjs/')

describe('optional dependencies stay behind their subpath', () => {
  it('the main entry and the Postgres-only layers load neither ioredis nor @nats-io', () => {
    const entries = [
      '@oncely/server',
      ...['outbox', 'inbox', 'steps', 'webhooks', 'jobs', 'redis'].map((s) => `@oncely/server/${s}`),
    ]
    const loaded = specifiersLoadedBy(entries)
    expect(loaded).toContain('@oncely/server/outbox') // the hook saw the imports
    expect(loaded.filter(optional)).toEqual([])
  })

  it('the nats subpath does load @nats-io (so the check above can fail)', () => {
    expect(specifiersLoadedBy(['@oncely/server/nats']).filter(optional)).toContain('@nats-io/transport-node')
  })

  it('the main entry, the Express, Koa and Fetch adapters load no web framework (Express and Koa are only types)', () => {
    const loaded = specifiersLoadedBy([
      '@oncely/server',
      '@oncely/server/express',
      '@oncely/server/koa',
      '@oncely/server/fetch',
    ])
    expect(loaded).toContain('@oncely/server/fetch')
    expect(loaded.filter(frameworks)).toEqual([])
  })

  it('no entry but the otel subpath loads @opentelemetry/*', () => {
    const entries = [
      '@oncely/server',
      ...[
        'fastify',
        'express',
        'fetch',
        'koa',
        'nestjs',
        'outbox',
        'inbox',
        'steps',
        'webhooks',
        'jobs',
        'redis',
        'nats',
        'testing',
      ].map((s) => `@oncely/server/${s}`),
    ]
    const loaded = specifiersLoadedBy(entries)
    expect(loaded).toContain('@oncely/server/testing')
    expect(loaded.filter(telemetry)).toEqual([])
  })

  it('the otel subpath does load @opentelemetry/api, and nothing else of OpenTelemetry (so the check above can fail)', () => {
    const loaded = new Set(specifiersLoadedBy(['@oncely/server/otel']).filter(telemetry))
    expect([...loaded]).toEqual(['@opentelemetry/api'])
  })

  it('the prisma subpath loads nothing of Prisma at run time (it uses only its types)', () => {
    const loaded = specifiersLoadedBy(['@oncely/server/prisma'])
    expect(loaded).toContain('@oncely/server/prisma')
    expect(loaded.filter((specifier) => specifier.startsWith('@prisma/') || specifier === 'prisma')).toEqual(
      [],
    )
  })

  it('the nestjs subpath loads Nest and rxjs, but neither of its platforms (the app picks one)', () => {
    const loaded = specifiersLoadedBy(['@oncely/server/nestjs']).filter(frameworks)
    expect(loaded).toEqual(expect.arrayContaining(['@nestjs/common', 'rxjs']))
    expect(loaded.filter((specifier) => specifier.startsWith('@nestjs/platform-'))).toEqual([])
  })

  it('the fastify subpath does load fastify-plugin (so the check above can fail)', () => {
    expect(specifiersLoadedBy(['@oncely/server/fastify']).filter(frameworks)).toContain('fastify-plugin')
  })

  it('only their own subpaths load postgres.js and Drizzle (and Drizzle over node-postgres no postgres.js)', () => {
    const isPostgresJs = (specifier: string) => specifier === 'postgres'
    const isDrizzle = (specifier: string) => specifier.startsWith('drizzle-orm')
    const loaded = specifiersLoadedBy(['@oncely/server', '@oncely/server/fastify', '@oncely/server/outbox'])
    expect(loaded).toContain('@oncely/server/outbox')
    expect(loaded.filter((s) => isPostgresJs(s) || isDrizzle(s))).toEqual([])
    // The postgres.js subpath imports postgres.js only to open its side lane, when first used.
    const drizzle = specifiersLoadedBy(['@oncely/server/drizzle', '@oncely/server/postgres-js'])
    expect(drizzle.filter(isDrizzle)).toContain('drizzle-orm')
    expect(drizzle.filter(isPostgresJs)).toEqual([])
  })

  // Each datasource's library (an optional peer) loads only through its own subpath (the TypeORM datasource uses
  // only TypeORM's types: it calls the DataSource it is given).
  const libraries = ['kysely', 'knex', 'typeorm']
  const loadedBySubpath: Record<string, string> = { kysely: 'kysely', knex: 'knex' }
  it('the main entry and the layers load no datasource library; each datasource subpath loads its own', () => {
    const layers = ['outbox', 'inbox', 'steps', 'webhooks', 'jobs', 'fastify', 'express', 'fetch', 'testing']
    const loaded = specifiersLoadedBy(['@oncely/server', ...layers.map((s) => `@oncely/server/${s}`)])
    expect(loaded).toContain('@oncely/server/testing')
    expect(loaded.filter((specifier) => libraries.includes(specifier))).toEqual([])
    for (const [subpath, library] of Object.entries(loadedBySubpath))
      expect(specifiersLoadedBy([`@oncely/server/${subpath}`])).toContain(library)
    expect(specifiersLoadedBy(['@oncely/server/typeorm'])).toContain('@oncely/server/typeorm')
  })
})
