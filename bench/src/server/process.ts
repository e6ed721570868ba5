// Parent side of the bench server: spawns src/server/main.ts in its own Node process and waits for READY.
import { spawn } from 'node:child_process'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'

export interface BenchServer {
  /** Base URL per variant that started; `POST <url>/ledger` is the business transaction. */
  urls: Record<string, string>
  /** Setup errors of the variants that did not start, by name. */
  failed: Record<string, string>
  /** The server process, for the CPU suite. */
  pid: number
  stop(): Promise<void>
}

const MAIN = fileURLToPath(new URL('./main.ts', import.meta.url))

export async function startServer(options: {
  databaseUrl: string
  redisUrl: string
  poolSize: number
  variants: readonly string[]
  /** Extra environment for the server process. */
  env?: Record<string, string>
  /**
   * A command that runs Node for the server, with its own arguments first (e.g. `['valgrind', '--tool=callgrind']`):
   * the server's pid is then the launcher's, which such a tool keeps.
   */
  launcher?: readonly string[]
}): Promise<BenchServer> {
  // BENCH_SERVER_NODE_ARGS adds Node flags to the server process, e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof".
  const nodeArgs = process.env.BENCH_SERVER_NODE_ARGS?.split(' ').filter(Boolean) ?? []
  // The server runs oncely's built packages (dist), as users do, not its sources: through tsx every closure the engine
  // creates per request would also pay for a function-name wrapper that the build does not have. `pnpm bench`
  // builds them first.
  const node = [process.execPath, ...nodeArgs, '--import', 'tsx', MAIN]
  const [command, ...args] = [...(options.launcher ?? []), ...node] as [string, ...string[]]
  const child = spawn(command, args, {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: {
      ...process.env,
      BENCH_DATABASE_URL: options.databaseUrl,
      BENCH_REDIS_URL: options.redisUrl,
      BENCH_POOL_SIZE: String(options.poolSize),
      BENCH_VARIANTS: options.variants.join(','),
      ...options.env,
    },
  })
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()))
  const line = await new Promise<string | undefined>((resolve) => {
    createInterface({ input: child.stdout }).on('line', (text) => {
      if (text.startsWith('READY ')) resolve(text.slice(6))
    })
    child.on('exit', () => resolve(undefined))
  })
  if (!line) throw new Error('the bench server exited before it was ready (its stderr is above)')
  const status = JSON.parse(line) as Record<string, { port: number } | { error: string }>
  const urls: Record<string, string> = {}
  const failed: Record<string, string> = {}
  for (const [name, entry] of Object.entries(status)) {
    if ('port' in entry) urls[name] = `http://127.0.0.1:${entry.port}`
    else failed[name] = entry.error
  }
  return {
    urls,
    failed,
    pid: child.pid ?? 0,
    async stop() {
      child.kill('SIGTERM')
      await exited
    },
  }
}
