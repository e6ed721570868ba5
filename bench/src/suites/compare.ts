// Throughput and added latency of each variant against its baseline, measured in adjacent pairs (baseline, variant,
// baseline, variant, ...) so drift in machine load hits both sides of a ratio alike. Every round measures every
// scenario, so two scenarios' ratios can be compared round by round (paired.ts). Reports medians over rounds with
// the per-round ratios.
import type pg from 'pg'
import { keySequence, type LoadResult, load } from '../load.js'
import { median } from '../stats.js'

export interface Shape {
  name: string
  connections: number
  /** Requests per timed run. */
  amount: number
}

/** One thing measured against the baseline: a variant on its first-execution or its replay path. */
export interface Scenario {
  id: string
  variant: string
  path: 'first' | 'replay'
  /** The variant it is divided by: the same INSERT on the same framework and library, no idempotency. */
  baseline: string
}

export interface PairResult {
  baseline: LoadResult
  scenario: LoadResult
  /** Ledger rows the timed scenario run added: the amount on a first path, 0 on a faithful replay path. */
  executions: number
}

export interface ScenarioSummary {
  scenario: Scenario
  shape: string
  /** Median over rounds of scenario req/s divided by the adjacent baseline's req/s. */
  throughputRatio: number
  /** That ratio in each round, in round order. */
  ratios: number[]
  /** Median over rounds of scenario p50 minus the adjacent baseline's p50, in ms. */
  addedP50Ms: number
  addedP99Ms: number
  /** Medians of the raw numbers, for context only: they depend on the machine and its load. */
  rps: number
  baselineRps: number
  p50Ms: number
  p99Ms: number
  /** Non-2xx responses or socket errors over all timed runs (should be 0). */
  failures: number
  executionsPerRequest: number
  pairs: PairResult[]
}

export interface CompareOptions {
  urls: Record<string, string>
  pool: pg.Pool
  scenarios: readonly Scenario[]
  shapes: readonly Shape[]
  rounds: number
  warmupRequests: number
  log: (line: string) => void
}

let runCounter = 0
const runPrefix = (label: string) => `${label}-${process.pid}-${Date.now().toString(36)}-${runCounter++}`

async function ledgerHead(pool: pg.Pool): Promise<number> {
  const { rows } = await pool.query<{ head: string | null }>('SELECT max(id) AS head FROM ledger')
  return Number(rows[0]?.head ?? 0)
}

const failures = (result: LoadResult) =>
  result.errors + Object.entries(result.statuses).reduce((n, [s, c]) => (Number(s) >= 300 ? n + c : n), 0)

/** The failures of one run by kind, e.g. `503 x12, socket errors x1`, so a log says what went wrong. */
const failureKinds = (result: LoadResult) =>
  [
    ...Object.entries(result.statuses)
      .filter(([status]) => Number(status) >= 300)
      .map(([status, count]) => `${status} x${count}`),
    ...(result.errors ? [`socket errors x${result.errors}`] : []),
  ].join(', ')

export async function compare(options: CompareOptions): Promise<ScenarioSummary[]> {
  const { urls, pool, log } = options
  const url = (variant: string) => {
    const found = urls[variant]
    if (!found) throw new Error(`variant ${variant} is not running`)
    return found
  }
  const summaries: ScenarioSummary[] = []
  for (const shape of options.shapes) {
    log(`\n${shape.name}: ${shape.connections} connection(s), ${shape.amount} requests per run`)
    const variants = new Set(options.scenarios.flatMap((s) => [s.baseline, s.variant]))
    for (const variant of variants) {
      await load({
        url: url(variant),
        connections: shape.connections,
        amount: options.warmupRequests,
        nextKey: keySequence(runPrefix('warm')),
      })
    }
    const pairs = new Map<string, PairResult[]>(options.scenarios.map((s) => [s.id, []]))
    for (let round = 0; round < options.rounds; round++) {
      // Rotate the order each round so no scenario always runs right after the same neighbour.
      const order = options.scenarios.map(
        (_, i) => options.scenarios[(i + round) % options.scenarios.length]!,
      )
      for (const scenario of order) {
        let nextKey = keySequence(runPrefix(scenario.id))
        if (scenario.path === 'replay') {
          const prefix = runPrefix(scenario.id)
          await load({
            url: url(scenario.variant),
            connections: shape.connections,
            amount: shape.amount,
            nextKey: keySequence(prefix, shape.amount),
          })
          nextKey = keySequence(prefix, shape.amount)
        }
        const baselineResult = await load({
          url: url(scenario.baseline),
          connections: shape.connections,
          amount: shape.amount,
          nextKey: keySequence(runPrefix(scenario.baseline)),
        })
        const head = await ledgerHead(pool)
        const result = await load({
          url: url(scenario.variant),
          connections: shape.connections,
          amount: shape.amount,
          nextKey,
        })
        const executions = (await ledgerHead(pool)) - head
        pairs.get(scenario.id)!.push({ baseline: baselineResult, scenario: result, executions })
        log(
          `  round ${round + 1} ${scenario.id.padEnd(28)} ${result.rps.toFixed(0).padStart(6)} req/s (${scenario.baseline} ${baselineResult.rps.toFixed(0)}), p50 ${result.p50.toFixed(2)} ms (baseline ${baselineResult.p50.toFixed(2)})${failures(result) ? `, failures: ${failureKinds(result)}` : ''}`,
        )
      }
    }
    for (const scenario of options.scenarios) {
      const list = pairs.get(scenario.id)!
      const ratios = list.map((p) => p.scenario.rps / p.baseline.rps)
      summaries.push({
        scenario,
        shape: shape.name,
        throughputRatio: median(ratios),
        ratios,
        addedP50Ms: median(list.map((p) => p.scenario.p50 - p.baseline.p50)),
        addedP99Ms: median(list.map((p) => p.scenario.p99 - p.baseline.p99)),
        rps: median(list.map((p) => p.scenario.rps)),
        baselineRps: median(list.map((p) => p.baseline.rps)),
        p50Ms: median(list.map((p) => p.scenario.p50)),
        p99Ms: median(list.map((p) => p.scenario.p99)),
        failures: list.reduce((n, p) => n + failures(p.scenario), 0),
        executionsPerRequest:
          list.reduce((n, p) => n + p.executions, 0) / list.reduce((n, p) => n + p.scenario.requests, 0),
        pairs: list,
      })
    }
  }
  return summaries
}

/** Two variants' first executions against each other, run after run (see {@link headToHead}). */
export interface HeadToHead {
  a: string
  b: string
  shape: string
  /** `a`'s req/s over `b`'s, one value per block of four runs (A B B A), in order. */
  ratios: number[]
  /** Non-2xx responses or socket errors over all the runs of either (should be 0). */
  failures: number
}

/**
 * Two variants' first executions measured directly against each other, in blocks of four adjacent runs, A B B A:
 * each block gives one ratio, `a`'s req/s over `b`'s as the geometric mean of its two runs of each, so a drift of the
 * machine that is steady over the block cancels, and so does a disturbance that comes every other run (a periodic
 * collection, a checkpoint), which falls on each side once. A target comparing two variants is judged on the median
 * of these rather than on the ratio of two ratios to two baseline runs, which carries the noise of four runs without
 * cancelling either: on a shared two-core machine that moved the median of three such rounds by more than 0.3
 * between runs of one build, and plain A B pairs alternated by 0.3 with which side ran first.
 */
export async function headToHead(options: {
  urls: Record<string, string>
  a: string
  b: string
  shape: Shape
  blocks: number
  log: (line: string) => void
}): Promise<HeadToHead> {
  const { shape, log } = options
  const run = (variant: string) =>
    load({
      url: options.urls[variant]!,
      connections: shape.connections,
      amount: shape.amount,
      nextKey: keySequence(runPrefix(`h2h-${variant}`)),
    })
  log(
    `\nhead to head, ${shape.name}: ${options.a} against ${options.b}, ${options.blocks} blocks of four runs`,
  )
  // No warm-up here: each side is a process of its own, warmed to its steady state when it started (warmUpProcess).
  const ratios: number[] = []
  let failed = 0
  for (let block = 0; block < options.blocks; block++) {
    const a1 = await run(options.a)
    const b1 = await run(options.b)
    const b2 = await run(options.b)
    const a2 = await run(options.a)
    failed += failures(a1) + failures(b1) + failures(b2) + failures(a2)
    const ratio = Math.sqrt((a1.rps * a2.rps) / (b1.rps * b2.rps))
    ratios.push(ratio)
    log(
      `  block ${block + 1} ${options.a} ${a1.rps.toFixed(0)}, ${a2.rps.toFixed(0)} req/s; ${options.b} ${b1.rps.toFixed(0)}, ${b2.rps.toFixed(0)} req/s: ${ratio.toFixed(2)}x`,
    )
  }
  return { a: options.a, b: options.b, shape: shape.name, ratios, failures: failed }
}
