import { randomBytes } from 'node:crypto'
import { writeSync } from 'node:fs'
import { type FileHandle, open, rename, unlink } from 'node:fs/promises'
import { QuotaExceededError } from '../../errors/quota-exceeded-error.js'
import { StorageError } from '../../errors/storage-error.js'

/** The errno code of a file-system error, if it has one. */
export const errno = (error: unknown): string | undefined => (error as NodeJS.ErrnoException | null)?.code

/** A file-system error as the store's documented error: `QuotaExceededError` for a full disk. */
export function fsError(error: unknown): StorageError {
  if (error instanceof StorageError) return error
  const code = errno(error)
  if (code === 'ENOSPC' || code === 'EDQUOT') {
    return new QuotaExceededError(
      `The disk is full (${code}); the intent was not recorded and nothing was sent`,
      { cause: error },
    )
  }
  return new StorageError(`File store failed: ${(error as Error).message}`, { cause: error })
}

/**
 * Replaces `path` with `text` in one atomic step (a temporary file renamed over it), without flushing: readers see
 * the old or the new text, never a mix, and a crash leaves one of them.
 */
export async function replaceFile(path: string, text: string): Promise<void> {
  const tmp = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`
  try {
    const handle = await open(tmp, 'w')
    try {
      await handle.writeFile(text)
    } finally {
      await handle.close()
    }
    await rename(tmp, path)
  } catch (error) {
    await unlink(tmp).catch(() => {})
    throw fsError(error)
  }
}

/** Flushes a directory, so the creations, renames and removals of names in it survive a power loss. */
export async function syncDir(dir: string): Promise<void> {
  try {
    const handle = await open(dir, 'r')
    try {
      await handle.sync()
    } finally {
      await handle.close()
    }
  } catch (error) {
    throw fsError(error)
  }
}

/** Removes `path`; a missing file is not an error. */
export async function removeIfPresent(path: string): Promise<void> {
  try {
    await unlink(path)
  } catch (error) {
    if (errno(error) !== 'ENOENT') throw fsError(error)
  }
}

const NO_SPACE = () => Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' })

/**
 * Writes all of `bytes` at `position`, synchronously: into the page cache, so it never waits for the disk (only a
 * flush does), and a round trip through the thread pool would cost more than the write. A write the file system
 * cuts short (a full disk writes what fits, then refuses the rest) continues until it is whole or fails.
 */
export function writeAllSync(handle: FileHandle, bytes: Buffer, position: number): void {
  try {
    for (let done = 0; done < bytes.length; ) {
      const written = writeSync(handle.fd, bytes, done, bytes.length - done, position + done)
      if (written === 0) throw NO_SPACE()
      done += written
    }
  } catch (error) {
    throw fsError(error)
  }
}

/** Writes all of `bytes` at `position` through the thread pool (for large writes), as {@link writeAllSync}. */
export async function writeAll(handle: FileHandle, bytes: Buffer, position: number): Promise<void> {
  try {
    for (let done = 0; done < bytes.length; ) {
      const { bytesWritten } = await handle.write(bytes, done, bytes.length - done, position + done)
      if (bytesWritten === 0) throw NO_SPACE()
      done += bytesWritten
    }
  } catch (error) {
    throw fsError(error)
  }
}
