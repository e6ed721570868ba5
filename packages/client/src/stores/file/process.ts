import { readFile, readlink } from 'node:fs/promises'

/**
 * A process, named so that another process that later gets the same pid is not taken for it: on Linux the boot
 * (`/proc/sys/kernel/random/boot_id`), the pid namespace and the process's start time; elsewhere the pid alone.
 */
export interface ProcessName {
  pid: number
  boot?: string
  ns?: string
  start?: string
}

let self: Promise<ProcessName> | undefined

/** This process's name, read once. */
export function thisProcess(): Promise<ProcessName> {
  self ??= (async () => {
    const [boot, ns, start] = await Promise.all([
      readFile('/proc/sys/kernel/random/boot_id', 'utf8').then((text) => text.trim()),
      readlink('/proc/self/ns/pid'),
      startOf(process.pid),
    ]).catch(() => [undefined, undefined, undefined] as const)
    return boot && ns && start ? { pid: process.pid, boot, ns, start } : { pid: process.pid }
  })()
  return self
}

/**
 * Whether the named process may still run. Exact when it ran on this boot in this pid namespace (its pid must
 * still belong to a process with the same start time); false when it ran on an earlier boot; otherwise true when
 * its pid exists here, or when it cannot be checked from here at all (another pid namespace), so that only its
 * lease can end its claims.
 */
export async function mayRun(name: ProcessName): Promise<boolean> {
  const me = await thisProcess()
  if (name.boot && me.boot && name.boot !== me.boot) return false
  if (name.ns && me.ns && name.ns !== me.ns) return true
  if (name.start && me.start) return (await startOf(name.pid).catch(() => undefined)) === name.start
  try {
    process.kill(name.pid, 0)
    return true
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM'
  }
}

// Field 22 of /proc/<pid>/stat: the start time in clock ticks since boot. The command name (field 2) is in
// parentheses and may itself hold spaces or parentheses, so fields are counted after the last ')'.
async function startOf(pid: number): Promise<string> {
  const text = await readFile(`/proc/${pid}/stat`, 'utf8')
  const start = text.slice(text.lastIndexOf(')') + 2).split(' ')[19]
  if (!start) throw new Error(`no start time in /proc/${pid}/stat`)
  return start
}
