/** The environment a client worker is started with; the driver writes it, the worker validates it. */
import { WORKER_CRASH_POINTS } from './faults.js'

export interface WorkerEnv {
  /** `ONCELY_CHAOS_WORKER_NAME`, e.g. `worker-2`. */
  name: string
  /** `ONCELY_CHAOS_BASE_URL`: the proxy in front of one API instance. */
  baseUrl: string
  /** `ONCELY_CHAOS_TENANT`: the bearer token this device uses. */
  tenant: string
  /** `ONCELY_CHAOS_STORE_DIR`: the fileStore directory, kept across restarts. */
  storeDir: string
  /** `ONCELY_CHAOS_TIMEOUT_MS`: per-attempt timeout. @default 2000 */
  timeoutMs: number
  /** `ONCELY_CHAOS_SEED`: seeds the crash draws. @default 0 */
  seed: number
  /** `ONCELY_CHAOS_WORKER_CRASH_AT`: comma-separated client steps to die at. @default none */
  crashAt: ReadonlySet<(typeof WORKER_CRASH_POINTS)[number]>
  /** `ONCELY_CHAOS_WORKER_CRASH_RATE`: probability of dying at each listed step. @default 0.05 */
  crashRate: number
}

/** Reads and validates the worker's environment; throws naming the variable. */
export function workerEnv(env: Record<string, string | undefined>): WorkerEnv {
  const required = (name: string) => {
    const value = env[name]
    if (!value) throw new TypeError(`Expected \`${name}\` to be set.`)
    return value
  }
  const number = (name: string, fallback: number, valid: (n: number) => boolean) => {
    const raw = env[name]
    if (raw === undefined || raw === '') return fallback
    const value = Number(raw)
    if (!valid(value)) throw new TypeError(`Expected \`${name}\` to be valid, got ${raw}.`)
    return value
  }
  const crashAt = (env.ONCELY_CHAOS_WORKER_CRASH_AT ?? '').split(',').filter(Boolean)
  for (const point of crashAt) {
    if (!(WORKER_CRASH_POINTS as readonly string[]).includes(point)) {
      throw new TypeError(
        `Unknown step \`${point}\` in \`ONCELY_CHAOS_WORKER_CRASH_AT\`; expected ${WORKER_CRASH_POINTS.join(', ')}.`,
      )
    }
  }
  const baseUrl = required('ONCELY_CHAOS_BASE_URL')
  if (!/^http:\/\/(127\.0\.0\.1|localhost)[:/]/.test(baseUrl)) {
    throw new TypeError(`Expected \`ONCELY_CHAOS_BASE_URL\` to be a loopback http URL, got ${baseUrl}.`)
  }
  return {
    name: required('ONCELY_CHAOS_WORKER_NAME'),
    baseUrl,
    tenant: required('ONCELY_CHAOS_TENANT'),
    storeDir: required('ONCELY_CHAOS_STORE_DIR'),
    timeoutMs: number('ONCELY_CHAOS_TIMEOUT_MS', 2000, (n) => Number.isInteger(n) && n > 0),
    seed: number('ONCELY_CHAOS_SEED', 0, (n) => Number.isInteger(n) && n >= 0 && n <= 0xffff_ffff),
    crashAt: new Set(crashAt as Array<(typeof WORKER_CRASH_POINTS)[number]>),
    crashRate: number('ONCELY_CHAOS_WORKER_CRASH_RATE', 0.05, (n) => n >= 0 && n <= 1),
  }
}
