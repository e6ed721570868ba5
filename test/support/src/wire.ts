// A loopback TCP proxy between a client (a bench server, a test's pool) and Postgres that counts what crosses it,
// per direction: bytes, round trips (a turn each time a connection's client sends after the server last spoke, so
// statements sent together count once) and statements (each Execute message of the extended protocol, and each
// statement of a simple Query message). It reads the frontend messages only to count them and forwards every byte
// unchanged.
import net from 'node:net'

export interface WireCounts {
  bytesToPostgres: number
  bytesFromPostgres: number
  roundTrips: number
  statements: number
  /** Connections the clients opened through the proxy so far. */
  connections: number
}

export interface CountingProxy {
  /** The database URL with its host and port replaced by the proxy's. */
  url: string
  counts(): WireCounts
  close(): Promise<void>
}

const SSL_REQUEST = 80877103
const GSSENC_REQUEST = 80877104

/** Statements in a simple Query's text: its `;`-separated parts outside quotes, dollar quotes and comments. */
export function countStatements(sql: string): number {
  let count = 0
  let content = false
  for (let i = 0; i < sql.length; i++) {
    const c = sql[i]!
    if (c === ';') {
      if (content) count++
      content = false
    } else if (c === "'" || c === '"') {
      const end = sql.indexOf(c, i + 1)
      i = end < 0 ? sql.length : end
      content = true
    } else if (c === '-' && sql[i + 1] === '-') {
      const end = sql.indexOf('\n', i)
      i = end < 0 ? sql.length : end
    } else if (c === '/' && sql[i + 1] === '*') {
      const end = sql.indexOf('*/', i + 2)
      i = end < 0 ? sql.length : end + 1
    } else if (c === '$') {
      const tag = /^\$[A-Za-z_]*\$/.exec(sql.slice(i))?.[0]
      if (tag) {
        const end = sql.indexOf(tag, i + tag.length)
        i = end < 0 ? sql.length : end + tag.length - 1
      }
      content = true
    } else if (!/\s/.test(c)) content = true
  }
  return content ? count + 1 : count
}

/** Reads the frontend messages of one connection as they arrive in chunks and counts its statements. */
function frontendCounter(onStatements: (n: number) => void): (chunk: Buffer) => void {
  let pending: Buffer = Buffer.alloc(0)
  // The startup packet (and an SSL or GSS request before it) has no type byte.
  let startup = true
  return (chunk) => {
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk])
    for (;;) {
      const head = startup ? 0 : 1
      if (pending.length < head + 4) return
      const length = pending.readInt32BE(head)
      if (pending.length < head + length) return
      if (startup) {
        const code = pending.readInt32BE(4)
        startup = code === SSL_REQUEST || code === GSSENC_REQUEST
      } else {
        const type = String.fromCharCode(pending[0]!)
        if (type === 'E') onStatements(1)
        else if (type === 'Q') onStatements(countStatements(pending.toString('utf8', 5, head + length - 1)))
      }
      pending = pending.subarray(head + length)
    }
  }
}

export async function countingProxy(databaseUrl: string): Promise<CountingProxy> {
  const target = new URL(databaseUrl)
  const counts: WireCounts = {
    bytesToPostgres: 0,
    bytesFromPostgres: 0,
    roundTrips: 0,
    statements: 0,
    connections: 0,
  }
  const sockets = new Set<net.Socket>()
  const proxy = net.createServer((client) => {
    counts.connections++
    const server = net.connect(Number(target.port || 5432), target.hostname)
    for (const socket of [client, server]) {
      socket.setNoDelay(true)
      sockets.add(socket)
      socket.on('close', () => sockets.delete(socket))
    }
    let serverSpoke = true
    const count = frontendCounter((n) => {
      counts.statements += n
    })
    client.on('data', (chunk) => {
      if (serverSpoke) counts.roundTrips++
      serverSpoke = false
      counts.bytesToPostgres += chunk.length
      count(chunk)
      server.write(chunk)
    })
    server.on('data', (chunk) => {
      serverSpoke = true
      counts.bytesFromPostgres += chunk.length
      client.write(chunk)
    })
    for (const [a, b] of [
      [client, server],
      [server, client],
    ] as const) {
      a.on('error', () => {})
      a.on('close', () => b.destroy())
    }
  })
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve))
  const through = new URL(databaseUrl)
  through.host = `127.0.0.1:${(proxy.address() as net.AddressInfo).port}`
  return {
    url: through.href,
    counts: () => ({ ...counts }),
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy()
        proxy.close(() => resolve())
      }),
  }
}
