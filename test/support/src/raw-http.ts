import { connect, type Socket } from 'node:net'

/**
 * One POST of an oversize body over a raw socket, from a client that reads nothing until it wrote the whole body (as
 * Python's http.client does): a reset that arrives first loses the answer, as it does for any client that has not
 * read it yet.
 */
export interface RawPost {
  /** The server's base URL, `http://127.0.0.1:port`. */
  url: string
  path: string
  /** Request headers besides Host, Content-Length and Transfer-Encoding. */
  headers: Record<string, string>
  /** Size of the JSON body in bytes. */
  bytes: number
  /** Announce the size (`Content-Length`) or not (`Transfer-Encoding: chunked`). */
  framing: 'content-length' | 'chunked'
  /**
   * `fast` writes 64 KiB chunks as fast as the socket takes them; `slow` writes 16 KiB chunks with a pause after
   * each, so the answer arrives while most of the body is still to be sent.
   */
  pace: 'fast' | 'slow'
  /** Gives up after this long (the outcome is then `timeout`). */
  timeoutMs?: number
}

/** A response read completely off a raw socket. */
export interface RawResponse {
  status: number
  /** Lower-case names. */
  headers: Record<string, string>
  body: string
}

/** How one raw exchange ended. */
export interface RawOutcome {
  /** The response, when it was read completely before the connection failed or closed. */
  response?: RawResponse
  /** Otherwise why not: the socket's error code (ECONNRESET, EPIPE), `closed` or `timeout`. */
  failure?: string
}

const pause = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** A JSON body of exactly `bytes` bytes: `{"cart":"xxx…","amount":1}`. */
export function jsonBodyOf(bytes: number): Buffer {
  const shell = '{"cart":"","amount":1}'
  return Buffer.from(`{"cart":"${'x'.repeat(Math.max(0, bytes - shell.length))}","amount":1}`)
}

/** Parses one complete HTTP/1.1 response at the start of `data`, or returns undefined while it is incomplete. */
export function parseRawResponse(data: Buffer): RawResponse | undefined {
  const headEnd = data.indexOf('\r\n\r\n')
  if (headEnd < 0) return undefined
  const [statusLine, ...lines] = data.subarray(0, headEnd).toString('latin1').split('\r\n')
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(statusLine ?? '')?.[1])
  const headers: Record<string, string> = {}
  for (const line of lines) {
    const colon = line.indexOf(':')
    headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim()
  }
  let rest = data.subarray(headEnd + 4)
  if (headers['transfer-encoding']?.toLowerCase() === 'chunked') {
    const parts: Buffer[] = []
    for (;;) {
      const lineEnd = rest.indexOf('\r\n')
      if (lineEnd < 0) return undefined
      const size = Number.parseInt(rest.subarray(0, lineEnd).toString('latin1'), 16)
      if (rest.length < lineEnd + 2 + size + 2) return undefined
      if (size === 0) break
      parts.push(rest.subarray(lineEnd + 2, lineEnd + 2 + size))
      rest = rest.subarray(lineEnd + 2 + size + 2)
    }
    return { status, headers, body: Buffer.concat(parts).toString('utf8') }
  }
  const length = Number(headers['content-length'] ?? 0)
  if (rest.length < length) return undefined
  return { status, headers, body: rest.subarray(0, length).toString('utf8') }
}

/**
 * Writes `chunk`; when the socket's buffer is full, waits until it drained or the socket closed (`closed`, one
 * promise per socket: a 'close' listener per full buffer would pile up).
 */
async function writeOrWait(socket: Socket, chunk: Buffer | string, closed: Promise<void>): Promise<void> {
  if (!socket.write(chunk))
    await Promise.race([new Promise<void>((drained) => socket.once('drain', () => drained())), closed])
}

/**
 * Sends the headers, then the body in chunks, then reads; settles once a complete response was read (then closes
 * the socket), or with the reason there was none.
 */
export function rawPost(options: RawPost): Promise<RawOutcome> {
  const { hostname, port } = new URL(options.url)
  const body = jsonBodyOf(options.bytes)
  const chunkSize = options.pace === 'fast' ? 65_536 : 16_384
  return new Promise((resolve) => {
    const socket: Socket = connect(Number(port), hostname)
    let received = Buffer.alloc(0)
    let settled = false
    const settle = (outcome: RawOutcome) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      socket.destroy()
      resolve(outcome)
    }
    const timer = setTimeout(() => settle({ failure: 'timeout' }), options.timeoutMs ?? 15_000)
    socket.on('data', (data: Buffer) => {
      received = Buffer.concat([received, data])
      const response = parseRawResponse(received)
      if (response) settle({ response })
    })
    socket.on('error', (error: NodeJS.ErrnoException) => settle({ failure: error.code ?? error.message }))
    socket.on('close', () => settle({ failure: 'closed' }))
    const closed = new Promise<void>((done) => socket.once('close', () => done()))

    const write = async (chunk: Buffer | string) => {
      if (settled || socket.destroyed) return
      await writeOrWait(socket, chunk, closed)
    }
    socket.pause()
    socket.once('connect', async () => {
      const framing =
        options.framing === 'chunked' ? 'transfer-encoding: chunked' : `content-length: ${body.length}`
      const head = Object.entries(options.headers).map(([name, value]) => `${name}: ${value}\r\n`)
      await write(
        `POST ${options.path} HTTP/1.1\r\nhost: ${hostname}:${port}\r\n${framing}\r\n${head.join('')}\r\n`,
      )
      for (let at = 0; at < body.length && !settled; at += chunkSize) {
        const chunk = body.subarray(at, at + chunkSize)
        if (options.framing === 'chunked') await write(`${chunk.length.toString(16)}\r\n`)
        await write(chunk)
        if (options.framing === 'chunked') await write('\r\n')
        if (options.pace === 'slow') await pause(1)
      }
      if (options.framing === 'chunked') await write('0\r\n\r\n')
      socket.resume()
    })
  })
}

/** How many outcomes were each: the status of a complete response, or the failure. */
export function tally(outcomes: readonly RawOutcome[]): Record<string, number> {
  const counts: Record<string, number> = {}
  for (const { response, failure } of outcomes) {
    const name = response ? String(response.status) : (failure ?? 'unknown')
    counts[name] = (counts[name] ?? 0) + 1
  }
  return counts
}

/** What a client saw that kept sending until the server closed the connection. */
export interface FloodOutcome {
  /** The response, when one was read completely before the connection closed. */
  response?: RawResponse
  /** Bytes of the body the socket accepted before the connection closed (or all of them). */
  written: number
  /** False when the connection was still open after `timeoutMs`. */
  closed: boolean
}

/**
 * Sends the headers of a chunked POST, then up to `bytes` of body in 64 KiB chunks (and then nothing, leaving the
 * body unfinished), reading all the while; settles once the server closed the connection.
 */
export function rawFlood(options: {
  url: string
  path: string
  headers: Record<string, string>
  bytes: number
  timeoutMs?: number
}): Promise<FloodOutcome> {
  const { hostname, port } = new URL(options.url)
  return new Promise((resolve) => {
    const socket = connect(Number(port), hostname)
    let received = Buffer.alloc(0)
    let written = 0
    let closed = false
    const settle = (outcome: Omit<FloodOutcome, 'response' | 'written'>) => {
      clearTimeout(timer)
      socket.destroy()
      resolve({ response: parseRawResponse(received), written, ...outcome })
    }
    const timer = setTimeout(() => settle({ closed: false }), options.timeoutMs ?? 30_000)
    socket.on('data', (data: Buffer) => {
      received = Buffer.concat([received, data])
    })
    socket.on('error', () => {})
    socket.on('close', () => {
      closed = true
      settle({ closed: true })
    })
    const gone = new Promise<void>((done) => socket.once('close', () => done()))
    const chunk = Buffer.concat([Buffer.from('10000\r\n'), Buffer.alloc(65_536, 'x'), Buffer.from('\r\n')])
    socket.once('connect', async () => {
      const head = Object.entries(options.headers).map(([name, value]) => `${name}: ${value}\r\n`)
      socket.write(
        `POST ${options.path} HTTP/1.1\r\nhost: ${hostname}:${port}\r\ntransfer-encoding: chunked\r\n${head.join('')}\r\n`,
      )
      while (written < options.bytes && !closed) {
        written += 65_536
        await writeOrWait(socket, chunk, gone)
      }
    })
  })
}
