// The datasource contract can see the window it guards: run with the writes going through a second connection of
// the same library (what a handler that forgot `ctx.tx` does), it must fail, under every datasource of registry.ts.
// Runs the suite in a child vitest, in the project that runs it under that datasource (vitest.config.ts).
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { expect, it } from 'vitest'
import { datasources } from './registry.js'

// vitest.config.ts names the projects: node-postgres runs in the protocol's own project.
const projectOf = (name: string) => (name === 'node-postgres' ? 'lock' : `lock on ${name}`)

it.each(Object.keys(datasources))(
  'the datasource contract on %s fails when the handler writes through a second connection',
  async (name) => {
    const cwd = fileURLToPath(new URL('../..', import.meta.url))
    const child = spawn(
      'npx',
      ['vitest', 'run', 'test/datasources/contract.test.ts', '--project', projectOf(name)],
      {
        cwd,
        env: { ...process.env, ONCELY_TEST_SABOTAGE: 'second-connection', FORCE_COLOR: '0' },
      },
    )
    let output = ''
    child.stdout.on('data', (chunk) => {
      output += chunk
    })
    child.stderr.on('data', (chunk) => {
      output += chunk
    })
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve))
    expect(code, output).not.toBe(0)
    // The cases that see the window: a write that must roll back with the attempt stays committed.
    expect(output).toContain('a handler that writes and throws leaves no row and a retryable key')
    expect(output).toContain('a process SIGKILLed mid-handler leaves no partial write')
  },
  120_000,
)
