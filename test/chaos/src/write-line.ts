/**
 * A synchronous line writer for a worker's stdout, which is a non-blocking pipe: when the driver has not read it yet
 * (hundreds of stored outcomes reported at start), a write fails with EAGAIN or lands in part. The rest waits for
 * room instead of crashing the worker, and the line is out before the call returns (before a self-inflicted
 * SIGKILL).
 */
import { writeSync } from 'node:fs'

const pause = new Int32Array(new SharedArrayBuffer(4))

/** Writes `text` and a newline to `fd`, all of it, blocking until the pipe takes it. */
export function writeLineSync(fd: number, text: string): void {
  const line = Buffer.from(`${text}\n`)
  for (let offset = 0; offset < line.length; ) {
    try {
      offset += writeSync(fd, line, offset)
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EAGAIN') throw error
      Atomics.wait(pause, 0, 0, 2)
    }
  }
}
