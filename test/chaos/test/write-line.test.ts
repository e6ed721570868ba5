import { spawn } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { describe, expect, it } from 'vitest'

const module = join(dirname(fileURLToPath(import.meta.url)), '../src/write-line.ts')

describe('writeLineSync', () => {
  it('waits for a full pipe instead of failing with EAGAIN, and loses no line', async () => {
    // 4 MB of lines into a pipe the parent does not read for a while: far more than a pipe buffer holds.
    const script = `import { writeLineSync } from ${JSON.stringify(module)}
for (let i = 0; i < 40000; i++) writeLineSync(1, 'line ' + i + ' ' + 'x'.repeat(90))`
    const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let stderr = ''
    child.stderr.on('data', (chunk) => {
      stderr += chunk
    })
    child.stdout.pause()
    await new Promise((resolve) => setTimeout(resolve, 1000))
    let lines = 0
    let last = ''
    child.stdout.on('data', (chunk: Buffer) => {
      const text = chunk.toString()
      lines += text.split('\n').length - 1
      last = (last + text).slice(-200)
    })
    child.stdout.resume()
    const code = await new Promise((resolve) => child.on('close', resolve))
    expect(stderr).toBe('')
    expect(code).toBe(0)
    expect(lines).toBe(40000)
    expect(last).toMatch(/line 39999 x+\n$/)
  }, 30_000)
})
