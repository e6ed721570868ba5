/**
 * Child processes the driver owns: servers and client workers. Each can be started (and restarted), stopped,
 * SIGKILLed, SIGSTOPped and SIGCONTed; readiness is a line on its output, or the port a line announces answering
 * 2xx on a health path; output is appended to `<logDir>/<name>.log` across restarts, so a failing run keeps every
 * incarnation's log.
 *
 * A server child binds port 0 and announces the port it got: a port the driver picked and handed over could be taken
 * by another process before the child binds it (every incarnation of a restarted server gets a new one).
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { createWriteStream, mkdirSync, type WriteStream } from 'node:fs'
import { join } from 'node:path'
import { createInterface } from 'node:readline'

/** Lines of output quoted in the error of a failed start. */
const TAIL_LINES = 20

export interface ExitInfo {
  code: number | null
  signal: NodeJS.Signals | null
}

/**
 * `line`: ready once a line matches. `port`: a line whose first capture group is the loopback port the process
 * bound (see {@link ManagedProcess.port}); ready then, or with `healthPath` once `http://127.0.0.1:<port><healthPath>`
 * answers 2xx.
 */
export type Readiness = { line: RegExp } | { port: RegExp; healthPath?: string }

export interface ProcessSpec {
  /** Names the process in logs and the history, e.g. `api-1`, `worker-3`. */
  name: string
  /** @default process.execPath (node) */
  command?: string
  args: string[]
  /**
   * Added to the driver's environment. A function is called at every start, so each incarnation can get its own
   * settings (a fresh seed, the next crash point).
   * @default {}
   */
  env?: Record<string, string> | (() => Record<string, string>)
  cwd?: string
  /** When the process counts as started. Without it, as soon as it is spawned. */
  ready?: Readiness
  /** @default 30000 */
  readyTimeoutMs?: number
  /** Directory for `<name>.log`. */
  logDir: string
  /** Every output line, as it arrives (a worker's events come this way). */
  onLine?: (line: string, stream: 'stdout' | 'stderr') => void
  /** Every exit, expected or not. */
  onExit?: (info: ExitInfo & { pid: number }) => void
}

export class ManagedProcess {
  readonly spec: ProcessSpec
  readonly logFile: string
  #child: ChildProcess | undefined
  #exited: Promise<ExitInfo> = Promise.resolve({ code: null, signal: null })
  #log: WriteStream | undefined
  #starts = 0
  #port: number | undefined

  constructor(spec: ProcessSpec) {
    if (!spec.name || !/^[\w.-]+$/.test(spec.name)) {
      throw new TypeError('Expected `name` to be a non-empty file-name-safe string.')
    }
    if (!Array.isArray(spec.args)) throw new TypeError('Expected `args` to be an array of strings.')
    if (spec.readyTimeoutMs !== undefined && !(spec.readyTimeoutMs > 0)) {
      throw new TypeError('Expected `readyTimeoutMs` to be a positive number.')
    }
    const health = spec.ready && 'port' in spec.ready ? spec.ready.healthPath : undefined
    if (health !== undefined && !health.startsWith('/')) {
      throw new TypeError('Expected `ready.healthPath` to be a path starting with /.')
    }
    this.spec = spec
    mkdirSync(spec.logDir, { recursive: true })
    this.logFile = join(spec.logDir, `${spec.name}.log`)
  }

  get name(): string {
    return this.spec.name
  }

  /** The current incarnation's pid, while it runs. */
  get pid(): number | undefined {
    return this.running ? this.#child?.pid : undefined
  }

  get running(): boolean {
    return this.#child !== undefined && this.#child.exitCode === null && this.#child.signalCode === null
  }

  /** The port the current incarnation announced (`ready: { port }`), once it did; a restart announces a new one. */
  get port(): number | undefined {
    return this.running ? this.#port : undefined
  }

  /** How many times it was started. */
  get starts(): number {
    return this.#starts
  }

  /** Resolves when the current incarnation exits. */
  get exited(): Promise<ExitInfo> {
    return this.#exited
  }

  /** Spawns it and waits for readiness; on failure the process is killed and the error quotes its last lines. */
  async start(): Promise<void> {
    if (this.running) throw new Error(`${this.name} is already running`)
    const { spec } = this
    this.#log ??= createWriteStream(this.logFile, { flags: 'a' })
    const child = spawn(spec.command ?? process.execPath, spec.args, {
      cwd: spec.cwd,
      env: { ...process.env, ...(typeof spec.env === 'function' ? spec.env() : spec.env) },
      stdio: ['pipe', 'pipe', 'pipe'],
    })
    this.#child = child
    this.#port = undefined
    this.#starts++
    this.#log.write(
      `--- ${spec.name} start #${this.#starts} pid ${child.pid} at ${new Date().toISOString()} ---\n`,
    )
    const readyLine = spec.ready && 'line' in spec.ready ? spec.ready.line : undefined
    const portLine = spec.ready && 'port' in spec.ready ? spec.ready : undefined
    let markReady: () => void = () => {}
    const ready = new Promise<void>((resolve) => {
      markReady = resolve
    })
    // This incarnation's last lines, for the error of a failed start (the log file may lag behind its stream).
    const tail: string[] = []
    // 'close' comes only after every stdio stream ended, so every 'data' chunk (and every line) was handled by then.
    const drained = new Promise<void>((resolve) => child.once('close', () => resolve()))
    for (const stream of ['stdout', 'stderr'] as const) {
      const source = child[stream]!
      source.on('data', (chunk: Buffer) => this.#log?.write(chunk))
      const lines = createInterface({ input: source })
      lines.on('line', (line) => {
        if (tail.push(line) > TAIL_LINES) tail.shift()
        if (readyLine?.test(line)) markReady()
        const announced = portLine && this.#port === undefined ? portLine.port.exec(line) : null
        if (announced && this.#child === child) {
          this.#port = Number(announced[1])
          const path = portLine!.healthPath
          if (path === undefined) markReady()
          else
            void this.#pollHealth(`http://127.0.0.1:${this.#port}${path}`, child).then(
              (ok) => ok && markReady(),
            )
        }
        spec.onLine?.(line, stream)
      })
    }
    child.stdin!.on('error', () => {}) // writes to a killed worker must not crash the driver
    const exited = new Promise<ExitInfo>((resolve) => {
      child.once('exit', (code, signal) => {
        this.#log?.write(`--- ${spec.name} pid ${child.pid} exited code=${code} signal=${signal} ---\n`)
        spec.onExit?.({ code, signal, pid: child.pid ?? 0 })
        resolve({ code, signal })
      })
    })
    this.#exited = exited
    if (!spec.ready) return
    const timeoutMs = spec.readyTimeoutMs ?? 30_000
    let timer: NodeJS.Timeout | undefined
    const outcome = await Promise.race([
      ready.then(() => 'ready' as const),
      exited,
      new Promise<'timeout'>((resolve) => {
        timer = setTimeout(() => resolve('timeout'), timeoutMs)
      }),
    ])
    clearTimeout(timer)
    if (outcome === 'ready') return
    // Kill this incarnation only: a newer one may have been started while this one was failing.
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    await exited
    // 'exit' can come before the pipes are read to the end: wait for the last lines (bounded, generously: a busy CI
    // took over 2 s to read 50 kB; the bound only matters when a grandchild holds the pipe open), so the error
    // quotes the process's last words, its reason for exiting.
    await Promise.race([drained, new Promise((resolve) => setTimeout(resolve, 10_000).unref())])
    const why =
      outcome === 'timeout'
        ? `not ready within ${timeoutMs} ms`
        : `exited (code ${outcome.code}) before ready`
    throw new Error(`${this.name} ${why}. Log tail:\n${tail.join('\n') || '(no output)'}`)
  }

  /** Sends one line to its stdin (workers read commands this way). Returns false if it is not running. */
  send(line: string): boolean {
    if (!this.running) return false
    return this.#child!.stdin!.write(`${line}\n`)
  }

  /** SIGKILL, and waits for the exit. */
  async kill(): Promise<ExitInfo> {
    if (this.running) this.#child!.kill('SIGKILL')
    return this.#exited
  }

  /** SIGTERM (after SIGCONT, in case it is paused), then SIGKILL if it has not exited after `timeoutMs`. */
  async stop(timeoutMs = 5000): Promise<ExitInfo> {
    if (!this.running) return this.#exited
    const child = this.#child!
    child.kill('SIGCONT')
    child.kill('SIGTERM')
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
    const info = await this.#exited
    clearTimeout(timer)
    return info
  }

  /** SIGSTOP: the process keeps its sockets and leases but does nothing (the fencing case). */
  pause(): void {
    if (this.running) this.#child!.kill('SIGSTOP')
  }

  /** SIGCONT. */
  resume(): void {
    if (this.running) this.#child!.kill('SIGCONT')
  }

  /** Sends `signal` (a process's own meaning: SIGUSR1 crashes pg-server's Postgres), and waits for the exit. */
  async signalAndWait(signal: NodeJS.Signals): Promise<ExitInfo> {
    if (this.running) this.#child!.kill(signal)
    return this.#exited
  }

  /** Closes the log once the process is gone for good. */
  async dispose(): Promise<void> {
    await this.stop()
    const log = this.#log
    this.#log = undefined
    if (log) await new Promise<void>((resolve) => log.end(resolve))
  }

  /** Resolves true once `url` answers 2xx, false if this incarnation exits first. */
  async #pollHealth(url: string, child: ChildProcess): Promise<boolean> {
    while (this.#child === child && this.running) {
      try {
        const response = await fetch(url, { signal: AbortSignal.timeout(1000) })
        await response.body?.cancel()
        if (response.ok) return true
      } catch {
        // not listening yet
      }
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    return false
  }
}
