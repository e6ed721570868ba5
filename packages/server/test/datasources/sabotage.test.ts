// The datasource contract can see the window it guards: run with the writes going through a second connection of
// the same library (what a handler that forgot `ctx.tx` does), it must fail. Runs the suite in a child vitest.
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { expect, it } from 'vitest'
import { datasources } from './registry.js'

// Under every datasource of the registry: node-postgres in the 'lock' project, the others in 'lock on <name>'.
it.each(Object.keys(datasources))(
  'the datasource contract on %s fails when the handler writes through a second connection',
  async (name) => {
    const cwd = fileURLToPath(new URL('../..', import.meta.url))
    const project = name === 'node-postgres' ? 'lock' : `lock on ${name}`
    const child = spawn('npx', ['vitest', 'run', 'test/datasources/contract.test.ts', '--project', project], {
      cwd,
      env: { ...process.env, ONCELY_TEST_SABOTAGE: 'second-connection', FORCE_COLOR: '0' },
    })
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
