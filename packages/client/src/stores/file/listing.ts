import { randomBytes } from 'node:crypto'
import { readdir, readFile, rename, unlink } from 'node:fs/promises'
import { join } from 'node:path'
import type { IntentRecord } from '../../intent.js'
import { CELL_BYTES, CELLS, CellPool } from './cells.js'
import { readChain } from './chain-file.js'
import { errno, fsError } from './fs.js'
import type { LockFiles } from './lock.js'
import type { FileOwner } from './owner.js'
import type { Placement } from './placement.js'
import { type Chain, parse } from './records.js'
import { SlotPool } from './slots.js'

/** What listing a store's directory needs. */
export interface ListingContext {
  dir: string
  leaseMs: number
  locks: LockFiles
  owner: FileOwner
  placement: Placement
}

/** Whether record `a` is a later version of an intent than `b`. */
export function isNewer(a: IntentRecord, b: IntentRecord): boolean {
  return a.createdAt > b.createdAt || (a.createdAt === b.createdAt && a.version > b.version)
}

/**
 * Every intent in the directory, the newer record of an intent winning. On the way it puts records found at the
 * wrong name in place, remembers the cells it read, and removes what no store needs any more: files of their own
 * that hold no record, slots and cells files of stores that are gone and hold none, and the owner files of gone
 * stores that left nothing behind.
 */
export async function listIntents(ctx: ListingContext): Promise<IntentRecord[]> {
  const names = await readdir(ctx.dir).catch((error) => {
    throw fsError(error)
  })
  const verdicts = new Map<string, Promise<boolean>>()
  const alive = (token: string) => {
    if (!verdicts.has(token)) verdicts.set(token, ctx.owner.alive(token))
    return verdicts.get(token)!
  }
  const found = new Map<string, IntentRecord>()
  const keep = (record: IntentRecord | undefined) => {
    const other = record && found.get(record.id)
    if (record && (!other || isNewer(record, other))) found.set(record.id, record)
  }
  await Promise.all(names.map((name) => listName(ctx, name, alive, keep)))
  // Owner files of stores that are gone and left no slots or cells behind.
  const owners = new Set(names.map((name) => SlotPool.ownerOf(name) ?? CellPool.ownerOf(name)))
  for (const name of names) {
    const token = /^([0-9a-f]{16})\.owner$/.exec(name)?.[1]
    if (token && !owners.has(token) && !(await alive(token)))
      await unlink(join(ctx.dir, name)).catch(() => {})
  }
  return [...found.values()]
}

// Reads one name of the directory: a file of its own, a cells file, or a slot of a store that is gone.
async function listName(
  ctx: ListingContext,
  name: string,
  alive: (token: string) => Promise<boolean>,
  keep: (record: IntentRecord | undefined) => void,
): Promise<void> {
  const path = join(ctx.dir, name)
  if (name.endsWith('.json')) {
    const content = await readChain({ path })
    if (content?.kind === 'chain' && `${ctx.placement.nameOf(content.chain.record.id)}.json` !== name) {
      keep(await recover(ctx, path, content.chain))
    } else if (content?.kind === 'chain') {
      keep(content.chain.record)
    } else if (content?.kind === 'free') {
      await unlink(path).catch(() => {}) // a file of its own is removed, not emptied: a leftover
    } else if (content?.kind === 'corrupt') {
      await ctx.placement.quarantine(path, content.reason)
    }
    return
  }
  const cellsOwner = CellPool.ownerOf(name)
  if (cellsOwner) {
    for (const record of await listCells(ctx, path, await alive(cellsOwner))) keep(record)
    return
  }
  const slotOwner = SlotPool.ownerOf(name)
  if (slotOwner && !(await alive(slotOwner))) {
    const content = await readChain({ path })
    if (content?.kind === 'chain') keep(await recover(ctx, path, content.chain))
    else await unlink(path).catch(() => {})
  }
}

// Puts a record found at the wrong name in place: one left in a slot by a store that died between flushing a
// write-ahead record and renaming it, or any file after a power loss undid renames. The newer record of an intent
// wins. A record whose writer is alive (its owner runs, or it holds the intent's lock) is still being written.
async function recover(ctx: ListingContext, path: string, chain: Chain): Promise<IntentRecord | undefined> {
  const id = chain.record.id
  if (chain.owner !== null && (await ctx.owner.alive(chain.owner))) return undefined
  const token = randomBytes(8).toString('hex')
  const lock = ctx.placement.lockOf(id)
  if (!(await ctx.locks.take(lock, () => ctx.locks.text(Date.now() + ctx.leaseMs, token)))) return undefined
  try {
    const there = await ctx.placement.find(id)
    if (there && !isNewer(chain.record, there.chain.record)) {
      await unlink(path).catch(() => {})
      return undefined
    }
    await rename(path, ctx.placement.fileOf(id))
    return there ? undefined : chain.record
  } finally {
    await unlink(lock).catch(() => {})
  }
}

// The records of one cells file, remembered for get(). The file is removed once no cell can hold a record any
// more: every cell emptied, or, when its store is gone, no cell holding one. (A cell of a live store that reads
// as neither may be a write-ahead being written right now.)
async function listCells(ctx: ListingContext, path: string, alive: boolean): Promise<IntentRecord[]> {
  let bytes: Buffer
  try {
    bytes = await readFile(path)
  } catch (error) {
    if (errno(error) === 'ENOENT') return []
    throw fsError(error)
  }
  const records: IntentRecord[] = []
  let emptiedCells = 0
  for (let cell = 0; cell < CELLS; cell++) {
    const content = parse(bytes.subarray(cell * CELL_BYTES, (cell + 1) * CELL_BYTES))
    if (content.kind === 'chain') {
      records.push(content.chain.record)
      ctx.placement.remember(content.chain.record.id, { path, cell: cell * CELL_BYTES })
    } else if (content.kind === 'free' && content.owner) emptiedCells++
  }
  if (alive ? emptiedCells === CELLS : records.length === 0) await unlink(path).catch(() => {})
  return records
}
