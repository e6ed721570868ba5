// What @oncely/server/otel costs: the instrumented engine against the bare one, in adjacent pairs (bare,
// instrumented, instrumented, bare, ...), in a server process of its own. Two setups, each its own process:
// - `sdk`: OpenTelemetry's context manager and W3C propagator registered (as the Node SDK does) in that process for
//   both sides, and the instrumented side recording every span (always sampled, batch processor) and every metric;
//   the ratio is then the instrumentation's own cost, not the context manager's, which any traced service pays.
// - `noop`: no SDK at all: the instrumentation on the API's no-op providers, which must cost nothing.
import { keySequence, type LoadResult, load } from '../load.js'
import { cpuSeconds } from '../proc.js'
import { startServer } from '../server/process.js'
import { median } from '../stats.js'

export interface OtelCost {
  setup: 'sdk' | 'noop'
  path: 'first' | 'replay'
  shape: string
  /** Median over rounds of instrumented req/s divided by the bare engine's req/s in the same pair. */
  throughputRatio: number
  ratios: number[]
  bareRps: number
  instrumentedRps: number
  /** Median of instrumented p50 minus bare p50, in ms. */
  addedP50Ms: number
  /**
   * Median over rounds of the server process's CPU per request, instrumented divided by bare (Linux only; null
   * elsewhere). CPU per request moves far less than req/s when other work shares the cores, so it is the reading to
   * trust on a busy machine.
   */
  cpuRatio: number | null
  /** Medians of the server process's CPU per request, microseconds. */
  bareCpuUs: number | null
  instrumentedCpuUs: number | null
  rounds: number
}

let counter = 0
const prefix = (label: string) => `otel-${label}-${process.pid}-${Date.now().toString(36)}-${counter++}`

export async function otelCost(options: {
  databaseUrl: string
  redisUrl: string
  poolSize: number
  rounds: number
  connections: number
  amount: number
  warmup: number
  log: (line: string) => void
}): Promise<OtelCost[]> {
  const results: OtelCost[] = []
  const setups = [
    {
      setup: 'sdk' as const,
      variant: 'oncely-otel',
      env: { BENCH_OTEL_CONTEXT: '1' } as Record<string, string>,
    },
    { setup: 'noop' as const, variant: 'oncely-otel-noop', env: {} as Record<string, string> },
  ]
  for (const { setup, variant, env } of setups) {
    const server = await startServer({
      databaseUrl: options.databaseUrl,
      redisUrl: options.redisUrl,
      poolSize: options.poolSize,
      variants: ['oncely-lock', variant],
      env,
    })
    try {
      const bare = server.urls['oncely-lock']
      const instrumented = server.urls[variant]
      if (!bare || !instrumented)
        throw new Error(`otel: a variant did not start: ${JSON.stringify(server.failed)}`)
      const shape = `c${options.connections}`
      options.log(
        `\notel (${setup}): oncely-lock vs ${variant}, ${shape}, ${options.amount} requests per run`,
      )
      for (const url of [bare, instrumented])
        await load({
          url,
          connections: options.connections,
          amount: options.warmup,
          nextKey: keySequence(prefix('warm')),
        })
      for (const path of ['first', 'replay'] as const) {
        type Run = LoadResult & { cpuUs: number }
        const pairs: Array<{ bare: Run; instrumented: Run }> = []
        for (let round = 0; round < options.rounds; round++) {
          const run = async (url: string) => {
            const keys = prefix(path)
            if (path === 'replay') {
              await load({
                url,
                connections: options.connections,
                amount: options.amount,
                nextKey: keySequence(keys, options.amount),
              })
            }
            const cpuBefore = cpuSeconds(server.pid)
            const result = await load({
              url,
              connections: options.connections,
              amount: options.amount,
              nextKey: path === 'replay' ? keySequence(keys, options.amount) : keySequence(keys),
            })
            const cpuUs = ((cpuSeconds(server.pid) - cpuBefore) * 1e6) / options.amount
            return { ...result, cpuUs }
          }
          // Alternate which side goes first, so drift over a round hits both alike.
          const pair =
            round % 2 === 0
              ? { bare: await run(bare), instrumented: await run(instrumented) }
              : { instrumented: await run(instrumented), bare: await run(bare) }
          pairs.push(pair)
          options.log(
            `  round ${round + 1} ${path.padEnd(6)} bare ${pair.bare.rps.toFixed(0)} req/s ${pair.bare.cpuUs.toFixed(0)} us CPU, instrumented ${pair.instrumented.rps.toFixed(0)} req/s ${pair.instrumented.cpuUs.toFixed(0)} us CPU (${(pair.instrumented.rps / pair.bare.rps).toFixed(3)}x)`,
          )
        }
        const ratios = pairs.map((p) => p.instrumented.rps / p.bare.rps)
        // /proc counts in clock ticks (10 ms): a run too short to have used any CPU reads 0, and has no ratio.
        const measuredCpu = pairs.filter((p) => p.bare.cpuUs > 0 && p.instrumented.cpuUs > 0)
        results.push({
          setup,
          path,
          shape,
          throughputRatio: median(ratios),
          ratios,
          bareRps: median(pairs.map((p) => p.bare.rps)),
          instrumentedRps: median(pairs.map((p) => p.instrumented.rps)),
          addedP50Ms: median(pairs.map((p) => p.instrumented.p50 - p.bare.p50)),
          cpuRatio:
            measuredCpu.length > 0
              ? median(measuredCpu.map((p) => p.instrumented.cpuUs / p.bare.cpuUs))
              : null,
          bareCpuUs: measuredCpu.length > 0 ? median(measuredCpu.map((p) => p.bare.cpuUs)) : null,
          instrumentedCpuUs:
            measuredCpu.length > 0 ? median(measuredCpu.map((p) => p.instrumented.cpuUs)) : null,
          rounds: options.rounds,
        })
      }
    } finally {
      await server.stop()
    }
  }
  return results
}
