import { mkdir, rename } from 'node:fs/promises'
import { join } from 'node:path'
import type { StoreEventSink } from '../../store.js'
import { errno, fsError } from './fs.js'

/** The folder of `dir` where unreadable files are moved. */
export const QUARANTINE = 'quarantine'

/**
 * Moves the unreadable file `file` of `dir` to `<dir>/quarantine/` and reports it with a `quarantined` event, so
 * that a corrupt file neither crashes the client nor is read again. A file already gone is left alone.
 */
export async function quarantine(
  dir: string,
  file: string,
  reason: string,
  sink: StoreEventSink | undefined,
): Promise<void> {
  const target = join(dir, QUARANTINE, `${file.slice(dir.length + 1)}.${Date.now()}`)
  try {
    await mkdir(join(dir, QUARANTINE), { recursive: true })
    await rename(file, target)
  } catch (error) {
    if (errno(error) !== 'ENOENT') throw fsError(error)
    return
  }
  sink?.('quarantined', { store: 'file', id: '', location: target, reason })
}
