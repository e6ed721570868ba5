import net from 'node:net'

/**
 * Finds an optional service for a test file: the URL from `envName` (then the tests must run, so a dead service
 * fails them), else the default loopback URL if something answers there, else a one-line reason to skip.
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
export async function waitFor(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}.`)
    await new Promise((resolve) => setTimeout(resolve, 25))
  }
}
