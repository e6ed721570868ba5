import path from 'node:path'
import { parseArgs } from 'node:util'
import { baselineOf, REGISTRY, VARIANT_NAMES } from './server/registry.js'

export interface BenchOptions {
  quick: boolean
  /** Where to write the JSON summary, resolved against the directory `pnpm bench` was started in. */
  json: string | undefined
  /** Suites to run. @default all */
  suites: ReadonlySet<Suite>
  /** Variants to start. @default all */
  variants: readonly string[]
  redisUrl: string
  /**
   * Key-table sizes for the scale suite's latency runs, each filled in turn (0 = the table as the reaper left it).
   * @default none with --quick, [0, 1_000_000, 10_000_000] otherwise
   */
  rows: readonly number[]
  /** Pending intents per store for the scale suite's resume() timing. @default 1000 with --quick, 10000 otherwise */
  intents: number
  /** Payments API instance counts for the instances suite. @default [1, 2, 4] */
  instances: readonly number[]
  /**
   * Requests per timed run at 10 connections (a fifth of them at 1); warm-ups and CPU runs shrink with it.
   * @default 1500 with --quick, 10000 otherwise
   */
  requests: number | undefined
  /** Load shapes of the server suite. @default ['c1', 'c10'] */
  shapes: readonly ('c1' | 'c10')[]
}

export const SUITES = [
  'server',
  'storm',
  'client',
  'client-browser',
  'scale',
  'cpu',
  'accounting',
  'adapters',
  'otel',
  'instances',
] as const
export type Suite = (typeof SUITES)[number]
export const VARIANTS = VARIANT_NAMES

export const USAGE = `usage: pnpm bench [-- --quick] [--json <file>] [--suites server,storm,client,client-browser,scale,cpu,accounting,adapters,otel,instances] [--variants a,b]

  --quick           short runs (3 rounds), no 1M/10M-row scale runs
  --json <file>     write the ratios and targets as JSON
  --suites <list>   run only these suites (default: all; client-browser needs Chromium, and with scale it
                    also times resume() of --intents intents in indexedDbStore; cpu splits each first
                    execution's CPU between the server, Postgres and the load generator, Linux only;
                    otel measures @oncely/server/otel against the bare engine in a process of its own;
                    instances runs 1, 2 and 4 payments API processes on one Postgres, sizes the key table
                    and times the reaper, Linux only; accounting counts each variant's round trips, statements
                    and bytes to and from Postgres per request through a counting proxy, and its WAL; adapters
                    measures the Express and Fetch adapters, a recovery point and each database library against
                    their own baselines)
  --variants <list> start only these server variants (default: those the chosen suites measure; with their
                    baselines: baseline is always started)
  --rows <list>     key-table sizes for the scale latency runs, e.g. 0,1M,3M (default: none with --quick,
                    0,1M,10M otherwise)
  --intents <n>     pending intents per store for the resume() timing (default 1000 with --quick, else 10000)
  --requests <n>    requests per timed run at 10 connections (default 1500 with --quick, 10000 otherwise; a
                    fifth at 1 connection): shorter runs for a machine too busy for the default
  --shapes <list>   load shapes of the server suite: c1, c10 (default both; the adapters suite runs c10)
  --instances <list> payments API instance counts for the instances suite (default 1,2,4)
                    known: ${VARIANTS.join(', ')}
  REDIS_URL         Redis for the Redis-backed peers (default redis://127.0.0.1:6379)
  DATABASE_URL      Postgres server; a fresh database is created on it and dropped afterwards`

/** The suites that load the bench server's variants of the `server` registry entries. */
const SERVER_SUITES: readonly Suite[] = ['server', 'storm', 'scale', 'cpu']

/**
 * The variants the chosen suites measure, when `--variants` is not given: the others would only hold connections
 * (each library variant opens a pool of its own).
 */
function variantsOf(suites: ReadonlySet<Suite>): string[] {
  return VARIANTS.filter((name) => {
    const suite = REGISTRY[name]?.suite
    return suite === 'adapters' ? suites.has('adapters') : SERVER_SUITES.some((s) => suites.has(s))
  })
}

function list(value: string | undefined, known: readonly string[], option: string): string[] | undefined {
  if (value === undefined) return undefined
  const items = value
    .split(',')
    .map((item) => item.trim())
    .filter(Boolean)
  for (const item of items) {
    if (!known.includes(item))
      throw new TypeError(`Unknown ${option} entry ${item}; known: ${known.join(', ')}`)
  }
  return items
}

/** Parses `1M`, `500k` or `250000` into a row count. */
function count(value: string, option: string): number {
  const match = /^(\d+(?:\.\d+)?)([kKmM]?)$/.exec(value.trim())
  if (!match) throw new TypeError(`${option} expects counts like 0, 500k or 1M; got ${value}`)
  const unit = { '': 1, k: 1_000, m: 1_000_000 }[match[2]!.toLowerCase() as '' | 'k' | 'm']
  return Math.round(Number(match[1]) * unit)
}

export function parseOptions(argv: readonly string[]): BenchOptions {
  const { values } = parseArgs({
    args: argv.filter((arg) => arg !== '--'),
    options: {
      quick: { type: 'boolean', default: false },
      json: { type: 'string' },
      suites: { type: 'string' },
      variants: { type: 'string' },
      rows: { type: 'string' },
      intents: { type: 'string' },
      instances: { type: 'string' },
      shapes: { type: 'string' },
      requests: { type: 'string' },
      help: { type: 'boolean', default: false },
    },
  })
  if (values.help) {
    console.log(USAGE)
    process.exit(0)
  }
  const base = process.env.INIT_CWD ?? process.cwd()
  const suites = new Set((list(values.suites, SUITES, '--suites') ?? SUITES) as Suite[])
  const variants = list(values.variants, VARIANTS, '--variants') ?? variantsOf(suites)
  const quick = values.quick ?? false
  const rows =
    values.rows === undefined
      ? quick
        ? []
        : [0, 1_000_000, 10_000_000]
      : values.rows.split(',').map((item) => count(item, '--rows'))
  const intents = values.intents === undefined ? (quick ? 1_000 : 10_000) : count(values.intents, '--intents')
  const instances = (values.instances ?? '1,2,4').split(',').map((item) => {
    const n = count(item, '--instances')
    if (n < 1) throw new TypeError(`--instances expects counts of at least 1; got ${item}`)
    return n
  })
  const shapes = (list(values.shapes, ['c1', 'c10'], '--shapes') ?? ['c1', 'c10']) as ('c1' | 'c10')[]
  const requests = values.requests === undefined ? undefined : count(values.requests, '--requests')
  if (requests !== undefined && requests < 10)
    throw new TypeError(`--requests expects at least 10; got ${requests}`)
  return {
    requests,
    shapes,
    quick,
    json: values.json === undefined ? undefined : path.resolve(base, values.json),
    suites,
    // Each variant with the baseline it is divided by (and the Fastify one, which the suites always measure).
    variants: [...new Set(['baseline', ...variants.flatMap((name) => [baselineOf(name), name])])],
    redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
    rows,
    intents,
    instances,
  }
}
