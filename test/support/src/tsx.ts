import { type ChildProcessByStdio, type SpawnOptions, spawn } from 'node:child_process'
import type { Readable, Writable } from 'node:stream'
import { fileURLToPath } from 'node:url'

/**
 * Starts a TypeScript file of this workspace in a Node process of its own, as the tests see the code: through tsx,
 * with workspace packages resolved to their sources (the `@oncely/source` condition). For tests that kill, stop or
 * crash a real process.
 *
 * @example
 * const child = spawnTsx(new URL('fixtures/consumer.ts', import.meta.url), [], { env: { ...process.env, DATABASE_URL } })
 */
export function spawnTsx(
  file: string | URL,
  args: readonly string[] = [],
  options: SpawnOptions = {},
): ChildProcessByStdio<Writable, Readable, Readable> {
  const path = typeof file === 'string' ? file : fileURLToPath(file)
  return spawn(process.execPath, ['--conditions=@oncely/source', '--import', 'tsx', path, ...args], {
    stdio: 'pipe',
    ...options,
  }) as ChildProcessByStdio<Writable, Readable, Readable>
}
