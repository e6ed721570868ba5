// What the allocation tools (engine-allocations, http-allocations) share: V8's sampling heap profiler around some
// work, with the objects garbage collection already freed counted too (what the collector will have had to clear),
// summed by allocating function.
import { Session } from 'node:inspector/promises'

interface ProfileNode {
  callFrame: { functionName: string; url: string; lineNumber: number }
  selfSize: number
  children: ProfileNode[]
}

/** Bytes allocated while `work` ran, divided by `per`, in all and by site (`function file:line`). */
export async function allocationsOf(
  work: () => Promise<void>,
  per: number,
  samplingInterval: number,
): Promise<{ total: number; sites: Map<string, number> }> {
  const session = new Session()
  session.connect()
  await session.post('HeapProfiler.startSampling', {
    samplingInterval,
    // Node 20's protocol types lack these two flags, which V8 takes: without them only what is still alive counts.
    ...{ includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true },
  })
  await work()
  const { profile } = (await session.post('HeapProfiler.stopSampling')) as { profile: { head: ProfileNode } }
  session.disconnect()
  const sites = new Map<string, number>()
  let total = 0
  const visit = (node: ProfileNode) => {
    const { functionName, url, lineNumber } = node.callFrame
    const file = url.replace(/^.*\/node_modules\/\.pnpm\//, '').replace(/^.*\/(packages|bench)\//, '')
    const site = `${functionName || '(anonymous)'} ${file}:${lineNumber + 1}`
    sites.set(site, (sites.get(site) ?? 0) + node.selfSize / per)
    total += node.selfSize / per
    for (const child of node.children) visit(child)
  }
  visit(profile.head)
  return { total, sites }
}

/** The `top` largest sites, one a line: bytes, then the site. */
export const largestSites = (sites: Map<string, number>, top: number): string[] =>
  [...sites]
    .sort((a, b) => b[1] - a[1])
    .slice(0, top)
    .map(([site, bytes]) => `${String(Math.round(bytes)).padStart(7)}  ${site}`)
