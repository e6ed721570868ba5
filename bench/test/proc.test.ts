// The CPU readers count a whole process: a Node process does part of its work off the main thread (the garbage
// collector, the optimizing compiler), and a reader of the main thread alone once credited the variants that
// allocate most with the least CPU.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { createInterface } from 'node:readline'
import { describe, expect, it } from 'vitest'
import { cpuSeconds } from '../src/proc.js'

// A child whose main thread waits while a worker thread spins for a fixed amount of work, then prints the CPU the
// child counts for itself (every thread) and waits to be read. The worker stays alive: an ended thread's time is
// not in /proc/<pid>/task (a Node server's threads live as long as it does).
const CHILD = `
const { Worker } = require('node:worker_threads')
const worker = new Worker('let x = 0; for (let i = 0; i < 3e8; i++) x = (x + i) % 1000003; require("node:worker_threads").parentPort.postMessage(x); setInterval(() => {}, 1000)', { eval: true })
worker.once('message', () => {
  const used = process.cpuUsage()
  console.log(JSON.stringify({ seconds: (used.user + used.system) / 1e6 }))
  setInterval(() => {}, 1000)
})
`

describe.runIf(process.platform === 'linux')('cpuSeconds', () => {
  it("counts every thread of a process, not only its main thread's", async () => {
    const child = spawn(process.execPath, ['-e', CHILD], { stdio: ['ignore', 'pipe', 'inherit'] })
    try {
      const [line] = (await once(createInterface({ input: child.stdout }), 'line')) as [string]
      const own = (JSON.parse(line) as { seconds: number }).seconds
      const read = cpuSeconds(child.pid!)
      // The worker did most of the work; the main thread alone would read a small fraction of it.
      expect(read).toBeGreaterThanOrEqual(own * 0.9)
      expect(read).toBeLessThanOrEqual(own * 1.1 + 0.05)
    } finally {
      child.kill('SIGKILL')
    }
  })
})
