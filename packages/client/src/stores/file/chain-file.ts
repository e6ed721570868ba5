import { type FileHandle, open, readFile } from 'node:fs/promises'
import { CELL_BYTES } from './cells.js'
import { errno, fsError, writeAllSync } from './fs.js'
import { type Chain, type Content, emptied, parse } from './records.js'

// Reading and writing one chain of record versions (see records.ts) where it lies. Which file or cell that is, is
// decided by placement.ts; this file only reads a chain's bytes, writes frames after its end, and empties it.

/** Where an intent's chain of versions is: a file of its own named after the intent, or a cell of a cells file. */
export interface Place {
  path: string
  /** The cell's offset in its cells file; undefined for a file of its own. */
  cell?: number
}

/** An intent's place, the chain it holds as last read or written, and an open handle once it was written. */
export interface OpenChain {
  place: Place
  chain: Chain
  handle?: FileHandle
  /** The handle belongs to the cell pool (a cells file of this store): never closed here. */
  shared?: boolean
}

/** What `place` holds; undefined when its file is gone. */
export async function readChain(place: Place): Promise<Content | undefined> {
  try {
    if (place.cell === undefined) return parse(await readFile(place.path))
    const handle = await open(place.path, 'r')
    try {
      const bytes = Buffer.alloc(CELL_BYTES)
      const { bytesRead } = await handle.read(bytes, 0, CELL_BYTES, place.cell)
      return parse(bytes.subarray(0, bytesRead))
    } finally {
      await handle.close()
    }
  } catch (error) {
    if (errno(error) === 'ENOENT') return undefined
    throw fsError(error)
  }
}

/**
 * Writes `frame`, the one that follows `file`'s chain (see `nextFrame`), after the chain's end without a flush, and
 * moves the chain on to it. False when the file is gone (the intent was deleted or discarded meanwhile).
 */
export async function appendFrame(file: OpenChain, frame: { bytes: Buffer; chain: Chain }): Promise<boolean> {
  let handle: FileHandle
  try {
    file.handle ??= await open(file.place.path, 'r+')
    handle = file.handle
  } catch (error) {
    if (errno(error) === 'ENOENT') return false
    throw fsError(error)
  }
  writeAllSync(handle, frame.bytes, (file.place.cell ?? 0) + file.chain.end)
  file.chain = frame.chain
  return true
}

/** Writes a first frame at `offset` of `handle` and flushes it with one fdatasync: the write-ahead. */
export async function writeDurably(handle: FileHandle, bytes: Buffer, offset: number): Promise<void> {
  writeAllSync(handle, bytes, offset)
  try {
    await handle.datasync()
  } catch (error) {
    throw fsError(error)
  }
}

/**
 * Overwrites a chain of `length` bytes at `offset` with zeros (and the token of the store `owner`, see `emptied`), so
 * that no byte of its record stays; flushed when `durable`.
 */
export async function emptyChain(
  handle: FileHandle,
  owner: string,
  length: number | undefined,
  offset: number,
  durable: boolean,
): Promise<void> {
  writeAllSync(handle, emptied(owner, length), offset)
  if (!durable) return
  try {
    await handle.datasync()
  } catch (error) {
    throw fsError(error)
  }
}

/** Closes `file`'s handle unless the cell pool owns it. */
export async function closeChain(file: OpenChain | undefined): Promise<void> {
  if (!file?.shared) await file?.handle?.close().catch(() => {})
}
