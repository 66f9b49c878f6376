//! [`OnceHooks`]: what runs once, when something happens to a lease or a journal (it is lost,
//! it breaks), for those who would otherwise keep a task or a registration per session waiting
//! for it (a rig deleting its workspace root, a host stopping a session's work).

use std::sync::Mutex;

/// Hooks run once, with what happened, after it is recorded; one added after that runs at
/// once. The hooks run where the event is recorded (a keepalive task, the owner watch, a
/// journal's append), possibly under a lock of the store's: they must neither block nor take
/// such a lock.
pub(crate) struct OnceHooks<A> {
    hooks: Mutex<Option<Hook<A>>>,
}

impl<A> Default for OnceHooks<A> {
    fn default() -> Self {
        Self {
            hooks: Mutex::new(None),
        }
    }
}

type Hook<A> = Box<dyn FnOnce(A) + Send>;

impl<A> std::fmt::Debug for OnceHooks<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnceHooks")
    }
}

impl<A: Copy + 'static> OnceHooks<A> {
    /// Adds `hook`, to run after those added before it; or runs it now, if `happened` says
    /// what happened already. `happened` is read under the hooks' lock, after which [`run`]
    /// takes them: so each hook runs once, here or there, as long as what happened is
    /// recorded before `run` is called.
    ///
    /// [`run`]: Self::run
    pub(crate) fn add(
        &self,
        happened: impl FnOnce() -> Option<A>,
        hook: impl FnOnce(A) + Send + 'static,
    ) {
        let mut slot = crate::sync::lock(&self.hooks);
        if let Some(what) = happened() {
            drop(slot);
            hook(what);
            return;
        }
        *slot = Some(match slot.take() {
            None => Box::new(hook),
            Some(earlier) => Box::new(move |what| {
                earlier(what);
                hook(what);
            }),
        });
    }

    /// Runs the hooks added so far, once, in order (none of them again later). Call it once
    /// what happened is recorded.
    pub(crate) fn run(&self, what: A) {
        let hooks = crate::sync::lock(&self.hooks).take();
        if let Some(hooks) = hooks {
            hooks(what);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[test]
    fn hooks_run_once_in_order_and_at_once_once_it_happened() {
        let (hooks, happened) = (OnceHooks::default(), AtomicBool::new(false));
        let ran = Arc::new(Mutex::new(Vec::new()));
        let seen = || happened.load(Ordering::Acquire).then_some(7);
        for name in ["first", "second"] {
            let ran = ran.clone();
            hooks.add(seen, move |what| ran.lock().unwrap().push((name, what)));
        }
        assert!(ran.lock().unwrap().is_empty(), "nothing runs before");
        happened.store(true, Ordering::Release);
        hooks.run(7);
        hooks.run(7);
        let late = ran.clone();
        hooks.add(seen, move |what| late.lock().unwrap().push(("late", what)));
        assert_eq!(
            *ran.lock().unwrap(),
            [("first", 7), ("second", 7), ("late", 7)]
        );
    }
}
