/**
 * A seeded TCP fault proxy on loopback (Toxiproxy and tc netem are not available here).
 *
 * In `http` mode it frames requests, so each request of a keep-alive connection gets its own fault decision, and a
 * request can be duplicated to a second upstream. In `tcp` mode (Postgres) the decision is taken once per
 * connection, on its first bytes. Decisions come from a seeded stream; which request meets which decision still
 * depends on scheduling, so a seed reproduces the fault mix and sequence, not the exact interleaving.
 */
import { connect, createServer, type Server, type Socket } from 'node:net'
import { RequestFramer } from './http-framing.js'
import type { Random } from './random.js'

/** The faults a proxy injects, in the order a random draw tests them. */
export const PROXY_FAULTS = ['drop-request', 'drop-response', 'delay', 'black-hole', 'duplicate'] as const

/**
 * - `drop-request`: close the client's connection before forwarding anything.
 * - `drop-response`: forward, then destroy both sides when the upstream starts replying (the server has committed).
 * - `delay`: hold the request for `delayMs` before forwarding; if the client gave up meanwhile, still deliver it.
 * - `black-hole`: accept and swallow everything, never answer, never close.
 * - `duplicate`: also send the request to `duplicateTo`, one of the two copies delayed up to `reorderMs`.
 */
export type ProxyFault = (typeof PROXY_FAULTS)[number]

export interface Upstream {
  /** Must be a loopback address: the suite never sends traffic off the machine. @default '127.0.0.1' */
  host?: string
  port: number
}

export interface ProxyFaultEvent {
  proxy: string
  fault: ProxyFault | 'kill-connections'
  connection: number
  /** `POST /v1/payments`, in http mode. */
  request?: string
  /** For `kill-connections`: how many sockets were destroyed. */
  count?: number
}

export interface FaultProxyOptions {
  /** Names the proxy in events and the history. @default 'proxy' */
  name?: string
  upstream: Upstream
  /** @default 'http' */
  protocol?: 'http' | 'tcp'
  /** The seeded stream decisions are drawn from; give each proxy its own fork. */
  random: Random
  /**
   * Probability of each fault per request (http) or connection (tcp); the rest pass through. Sum at most 1.
   * @default {}
   * @example { 'drop-response': 0.1, delay: 0.05 }
   */
  rates?: Partial<Record<ProxyFault, number>>
  /** How long `delay` holds a request; make it longer than the client's attempt timeout. @default 3000 */
  delayMs?: number
  /** Second upstream for `duplicate` (another server instance). Required when `duplicate` can happen. */
  duplicateTo?: Upstream
  /** Upper bound of the random delay put on one of the two copies of a duplicate. @default 50 */
  reorderMs?: number
  /** Called for every injected fault, synchronously, before it takes effect. */
  onFault?: (event: ProxyFaultEvent) => void
}

const LOOPBACK = new Set(['127.0.0.1', '::1', 'localhost'])
/** A detached copy (duplicate, late delivery) is abandoned after this long without an answer. */
const DETACHED_TIMEOUT_MS = 30_000

export type ProxyCounts = Record<ProxyFault | 'pass' | 'kill-connections', number>

export class FaultProxy {
  readonly name: string
  readonly counts: ProxyCounts
  readonly #options: Required<Omit<FaultProxyOptions, 'duplicateTo' | 'onFault' | 'name'>> &
    Pick<FaultProxyOptions, 'duplicateTo' | 'onFault'>
  readonly #server: Server
  readonly #sockets = new Set<Socket>()
  readonly #timers = new Set<NodeJS.Timeout>()
  readonly #forced: Array<ProxyFault | 'pass'> = []
  /** Upstream bytes held back from their clients while {@link hold} is on, per client socket. */
  readonly #held = new Map<Socket, Buffer[]>()
  #holding = false
  #rates: Partial<Record<ProxyFault, number>> = {}
  #upstream: Upstream
  #duplicateTo: Upstream | undefined
  #connections = 0

  private constructor(options: FaultProxyOptions) {
    this.name = options.name ?? 'proxy'
    this.#options = {
      protocol: 'http',
      rates: {},
      delayMs: 3000,
      reorderMs: 50,
      ...options,
    }
    checkUpstream('upstream', options.upstream)
    this.#upstream = options.upstream
    if (options.duplicateTo) checkUpstream('duplicateTo', options.duplicateTo)
    this.#duplicateTo = options.duplicateTo
    if (this.#options.protocol !== 'http' && this.#options.protocol !== 'tcp') {
      throw new TypeError("Expected `protocol` to be 'http' or 'tcp'.")
    }
    if (this.#options.protocol === 'tcp' && options.duplicateTo) {
      throw new TypeError('`duplicateTo` needs `protocol: http`: a raw TCP stream has no request to copy.')
    }
    for (const name of ['delayMs', 'reorderMs'] as const) {
      const value = this.#options[name]
      if (!Number.isInteger(value) || value < 0)
        throw new TypeError(`Expected \`${name}\` to be an integer >= 0.`)
    }
    this.setRates(this.#options.rates)
    this.counts = Object.fromEntries(
      [...PROXY_FAULTS, 'pass', 'kill-connections'].map((k) => [k, 0]),
    ) as ProxyCounts
    this.#server = createServer((socket) => this.#accept(socket))
  }

  /** Starts a proxy listening on an ephemeral loopback port. */
  static async start(options: FaultProxyOptions): Promise<FaultProxy> {
    const proxy = new FaultProxy(options)
    await new Promise<void>((resolve, reject) => {
      proxy.#server.once('error', reject)
      proxy.#server.listen(0, '127.0.0.1', () => resolve())
    })
    return proxy
  }

  /** The port clients connect to. */
  get port(): number {
    const address = this.#server.address()
    if (address === null || typeof address === 'string') throw new Error(`${this.name} is not listening`)
    return address.port
  }

  /** Replaces the fault rates, e.g. to heal (`{}`) or partition (`{ 'black-hole': 1 }`). */
  setRates(rates: Partial<Record<ProxyFault, number>>): void {
    let sum = 0
    for (const [fault, rate] of Object.entries(rates)) {
      if (!(PROXY_FAULTS as readonly string[]).includes(fault)) {
        throw new TypeError(
          `Unknown fault \`${fault}\` in \`rates\`; expected one of ${PROXY_FAULTS.join(', ')}.`,
        )
      }
      if (typeof rate !== 'number' || !(rate >= 0 && rate <= 1)) {
        throw new TypeError(`Expected \`rates.${fault}\` to be a probability in [0, 1].`)
      }
      sum += rate
    }
    if (sum > 1 + 1e-9) throw new TypeError(`Expected \`rates\` to sum to at most 1, got ${sum}.`)
    if ((rates.duplicate ?? 0) > 0) this.#needDuplicateTarget()
    this.#rates = { ...rates }
  }

  /**
   * Makes the next requests (http) or connections (tcp) meet these faults (or `pass`), in order, before any random
   * draw. Tests and the nemesis use it to make sure every fault kind really happens.
   */
  force(...faults: Array<ProxyFault | 'pass'>): void {
    if (faults.includes('duplicate')) this.#needDuplicateTarget()
    this.#forced.push(...faults)
  }

  /**
   * Sends new connections to another upstream, as a load balancer does when a health check fails (the nemesis
   * moves traffic off a paused instance so another one takes its keys over) or an instance comes back on another
   * port; `duplicateTo`, when given, moves the duplicates' target too. Open connections stay where they are.
   */
  retarget(upstream: Upstream, duplicateTo?: Upstream): void {
    checkUpstream('upstream', upstream)
    if (duplicateTo !== undefined) {
      if (this.#options.protocol === 'tcp') throw new TypeError('`duplicateTo` needs `protocol: http`.')
      checkUpstream('duplicateTo', duplicateTo)
      this.#duplicateTo = duplicateTo
    }
    this.#upstream = upstream
  }

  /** Where new connections go. */
  get upstream(): Upstream {
    return this.#upstream
  }

  /**
   * Holds back what upstreams send to their clients (the client's bytes still go through), as a network that stops
   * delivering one way: in front of a primary, its streaming standby falls behind. `release()` delivers what was held;
   * a connection closed meanwhile loses it.
   */
  hold(): void {
    this.#holding = true
  }

  /** Ends {@link hold}: delivers what was held, in order, and forwards from then on. */
  release(): void {
    this.#holding = false
    for (const [client, chunks] of this.#held) for (const chunk of chunks) client.write(chunk)
    this.#held.clear()
  }

  /** Destroys every open connection through the proxy now; returns how many sockets were destroyed. */
  killAll(): number {
    const count = this.#sockets.size
    this.counts['kill-connections']++
    this.#options.onFault?.({ proxy: this.name, fault: 'kill-connections', connection: 0, count })
    for (const socket of this.#sockets) socket.destroy()
    this.#sockets.clear()
    this.#held.clear()
    return count
  }

  /** Stops listening, cancels held requests and destroys every connection. */
  async close(): Promise<void> {
    for (const timer of this.#timers) clearTimeout(timer)
    this.#timers.clear()
    for (const socket of this.#sockets) socket.destroy()
    this.#sockets.clear()
    await new Promise<void>((resolve) => this.#server.close(() => resolve()))
  }

  #needDuplicateTarget(): void {
    if (!this.#duplicateTo) throw new TypeError('The `duplicate` fault needs `duplicateTo`.')
  }

  #decide(): ProxyFault | 'pass' {
    const forced = this.#forced.shift()
    if (forced) return forced
    const draw = this.#options.random.next()
    let cumulative = 0
    for (const fault of PROXY_FAULTS) {
      cumulative += this.#rates[fault] ?? 0
      if (draw < cumulative) return fault
    }
    return 'pass'
  }

  #track(socket: Socket): Socket {
    this.#sockets.add(socket)
    socket.on('error', () => socket.destroy())
    socket.on('close', () => {
      this.#sockets.delete(socket)
      this.#held.delete(socket)
    })
    return socket
  }

  #sleep(ms: number): Promise<void> {
    if (ms === 0) return Promise.resolve()
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#timers.delete(timer)
        resolve()
      }, ms)
      this.#timers.add(timer)
    })
  }

  /** Sends bytes on a connection nobody waits on (a duplicate, a late delivery) and discards the answer. */
  #sendDetached(target: Upstream, bytes: Buffer): void {
    const socket = this.#track(connect(target.port, target.host ?? '127.0.0.1'))
    socket.write(bytes)
    socket.on('data', () => socket.destroy())
    const timer = setTimeout(() => socket.destroy(), DETACHED_TIMEOUT_MS)
    this.#timers.add(timer)
    socket.on('close', () => {
      clearTimeout(timer)
      this.#timers.delete(timer)
    })
  }

  #accept(client: Socket): void {
    const connection = ++this.#connections
    this.#track(client)
    const { protocol } = this.#options
    const target = this.#upstream
    let upstream: Socket | undefined
    let dropResponse = false
    let blackHoled = false
    let decided = false
    let chain = Promise.resolve()
    const framer = new RequestFramer()

    const destroyBoth = () => {
      client.destroy()
      upstream?.destroy()
    }
    const forward = (bytes: Buffer) => {
      if (client.destroyed) return
      if (!upstream) {
        upstream = this.#track(connect(target.port, target.host ?? '127.0.0.1'))
        upstream.on('data', (chunk) => {
          if (dropResponse) return destroyBoth()
          if (!this.#holding) return client.write(chunk)
          const held = this.#held.get(client) ?? []
          held.push(chunk)
          this.#held.set(client, held)
        })
        // A connection that ends while its bytes are held loses them, as behind a broken link.
        upstream.on('end', () => (this.#held.has(client) ? client.destroy() : client.end()))
        upstream.on('close', () => client.destroy())
      }
      upstream.write(bytes)
    }
    const apply = async (bytes: Buffer, request?: string) => {
      const fault = protocol === 'tcp' && decided ? 'pass' : this.#decide()
      decided = true
      this.counts[fault]++
      if (fault !== 'pass') {
        this.#options.onFault?.({ proxy: this.name, fault, connection, ...(request ? { request } : {}) })
      }
      switch (fault) {
        case 'pass':
          return forward(bytes)
        case 'drop-request':
          return destroyBoth()
        case 'drop-response':
          dropResponse = true
          return forward(bytes)
        case 'black-hole':
          blackHoled = true
          return
        case 'delay':
          await this.#sleep(this.#options.delayMs)
          if (client.destroyed) return this.#sendDetached(target, bytes)
          return forward(bytes)
        case 'duplicate': {
          const lag = this.#options.random.int(0, this.#options.reorderMs)
          const copyFirst = this.#options.random.chance(0.5)
          const copyTo = this.#duplicateTo!
          const copy = () => this.#sendDetached(copyTo, bytes)
          if (copyFirst) copy()
          await this.#sleep(lag)
          forward(bytes)
          if (!copyFirst) copy()
        }
      }
    }

    client.on('close', () => upstream?.destroy())
    client.on('end', () => upstream?.end())
    client.on('data', (chunk) => {
      if (blackHoled) return
      let units: Array<{ bytes: Buffer; request?: string }>
      if (protocol === 'tcp') {
        units = [{ bytes: chunk }]
      } else {
        try {
          units = framer.push(chunk).map((r) => ({ bytes: r.bytes, request: r.line }))
        } catch {
          return destroyBoth()
        }
      }
      for (const unit of units) {
        chain = chain.then(() =>
          blackHoled || client.destroyed ? undefined : apply(unit.bytes, unit.request),
        )
      }
    })
  }
}

function checkUpstream(name: string, upstream: Upstream | undefined): void {
  if (!upstream || !Number.isInteger(upstream.port) || upstream.port <= 0 || upstream.port > 65535) {
    throw new TypeError(`Expected \`${name}.port\` to be a TCP port.`)
  }
  if (upstream.host !== undefined && !LOOPBACK.has(upstream.host)) {
    throw new TypeError(`Expected \`${name}.host\` to be a loopback address, got ${upstream.host}.`)
  }
}
