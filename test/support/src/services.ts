/** Optional services for tests (NATS JetStream, Redis), found on loopback only. */
import net from 'node:net'

/**
 * The URL from `envName` (then the tests must run, so a dead service fails them), else the default loopback URL
 * if something answers there, else a one-line reason to skip.
 *
 * @example
 * const redis = await optionalService('REDIS_URL', 'redis://127.0.0.1:6379')
 * describe.skipIf(redis.skip)('soft lease', () => { ... })
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

/** Polls `check` every 25 ms until it returns true, or throws naming `what` after `timeoutMs`. */
export async function waitFor(
  what: string,
  check: () => Promise<boolean> | boolean,
  timeoutMs = 15_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}.`)
    await new Promise((resolve) => setTimeout(resolve, 25))
  }
}

/**
 * A port on 127.0.0.1 that nothing listens on right now. Only for a child that cannot bind port 0 and report the
 * port it got (PgBouncer, a README example listening on $PORT): another process can take the port before the child
 * binds it, so whoever hands it over must try again with another port when the child fails with EADDRINUSE.
 */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer()
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo
      server.close(() => resolve(port))
    })
  })
}

/** Whether something accepts connections on 127.0.0.1:`port`. */
export function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1', () => {
      socket.destroy()
      resolve(true)
    })
    socket.on('error', () => resolve(false))
  })
}

/**
 * Pulls one JetStream message, or null when none came within `expiresMs`. A one-message pull is watched by the
 * client's idle-heartbeat monitor, which gives up after two heartbeat intervals without traffic; by default the
 * interval is half the pull's expiry, so on a loaded machine the monitor can trip just before the server's own
 * "expired" answer arrives, and `next()` rejects with "heartbeats missed". For a loop that pulls until a deadline,
 * that is a pull that found nothing, as the server's answer would have said: this returns null for it.
 *
 * @example
 * const msg = await pullNext(consumer, 5_000)
 * if (!msg) continue
 */
export async function pullNext<M>(
  consumer: { next(opts: { expires: number }): Promise<M | null> },
  expiresMs: number,
): Promise<M | null> {
  try {
    return await consumer.next({ expires: expiresMs })
  } catch (error) {
    if (error instanceof Error && error.message === 'heartbeats missed') return null
    throw error
  }
}
