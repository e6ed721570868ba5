/**
 * Finds the optional services the layer scenarios need (NATS JetStream, Redis) on loopback only.
 */
import net from 'node:net'

/**
 * The URL from `envName` (then the scenario must run, so a dead service fails it), else the default loopback URL if
 * something answers there, else a one-line reason to skip.
 */
export async function optionalService(
  envName: 'NATS_URL' | 'REDIS_URL',
  defaultUrl: string,
): Promise<{ url: string; skip: false } | { url: ''; skip: string }> {
  const fromEnv = process.env[envName]
  if (fromEnv) return { url: fromEnv, skip: false }
  const { hostname, port } = new URL(defaultUrl)
  const up = await new Promise<boolean>((resolve) => {
    const socket = net.connect(Number(port), hostname, () => {
      socket.destroy()
      resolve(true)
    })
    socket.setTimeout(500, () => {
      socket.destroy()
      resolve(false)
    })
    socket.on('error', () => resolve(false))
  })
  if (up) return { url: defaultUrl, skip: false }
  return { url: '', skip: `${envName} is unset and nothing answers at ${defaultUrl}` }
}

/** Polls `check` until it returns true or `timeoutMs` passes (then throws with `what`). */
export async function waitFor(what: string, check: () => Promise<boolean> | boolean, timeoutMs: number) {
  const deadline = Date.now() + timeoutMs
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}.`)
    await sleep(50)
  }
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** Counts per fault kind; every kind a scenario injects starts at 0, so a kind that never happened shows. */
export type FaultCounts = Record<string, number>

/** What every scenario returns: its fault counts, its violations (empty when it passed) and its duration. */
export interface ScenarioResult {
  faults: FaultCounts
  violations: string[]
  durationMs: number
  /** Scenario-specific numbers for the report (messages, publish attempts, keys, ...). */
  stats: Record<string, number>
}
