import path from 'node:path'
import { parseArgs } from 'node:util'

export interface BenchOptions {
  quick: boolean
  /** Where to write the JSON summary, resolved against the directory `pnpm bench` was started in. */
  json: string | undefined
  /** Suites to run. @default all */
  suites: ReadonlySet<Suite>
  /** Variants to start. @default all */
  variants: readonly string[]
  redisUrl: string
}

export const SUITES = ['server', 'storm', 'client', 'scale'] as const
export type Suite = (typeof SUITES)[number]
export const VARIANTS = [
  'baseline',
  'oncely',
  'node-idempotency-pg',
  'node-idempotency-redis',
  'powertools-redis',
]

export const USAGE = `usage: pnpm bench [-- --quick] [--json <file>] [--suites server,storm,client,scale] [--variants a,b]

  --quick           short runs (3 rounds), no 1M/10M-row scale runs
  --json <file>     write the ratios and targets as JSON
  --suites <list>   run only these suites (default: all; scale row fills run only without --quick)
  --variants <list> start only these server variants (baseline is always started)
                    known: ${VARIANTS.join(', ')}
  REDIS_URL         Redis for the Redis-backed peers (default redis://127.0.0.1:6379)
  DATABASE_URL      Postgres server; a fresh database is created on it and dropped afterwards`

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

export function parseOptions(argv: readonly string[]): BenchOptions {
  const { values } = parseArgs({
    args: argv.filter((arg) => arg !== '--'),
    options: {
      quick: { type: 'boolean', default: false },
      json: { type: 'string' },
      suites: { type: 'string' },
      variants: { type: 'string' },
      help: { type: 'boolean', default: false },
    },
  })
  if (values.help) {
    console.log(USAGE)
    process.exit(0)
  }
  const base = process.env.INIT_CWD ?? process.cwd()
  const variants = list(values.variants, VARIANTS, '--variants') ?? VARIANTS
  return {
    quick: values.quick ?? false,
    json: values.json === undefined ? undefined : path.resolve(base, values.json),
    suites: new Set((list(values.suites, SUITES, '--suites') ?? SUITES) as Suite[]),
    variants: variants.includes('baseline') ? variants : ['baseline', ...variants],
    redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
  }
}
