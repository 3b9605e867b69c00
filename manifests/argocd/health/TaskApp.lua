-- Argo CD health check for posttrain.dev/TaskApp (Lua 5.1, as Argo CD runs it; `obj` is the resource).
-- Healthy:     status.verified is true (GET /health and /task_info answered with the API key)
-- Degraded:    the Verified condition is False (the operator gave up, or a verified task app stopped
--              answering), phase Failed, or a Failed/Degraded condition that is True (message: why)
-- Suspended:   phase Suspended
-- Progressing: anything else: no status yet, Verified condition Unknown (still trying), Pending, Verifying
-- Tested by tests/unit/test_argocd_health.py.
local hs = {}
local status = obj.status or {}

local function condition(ctype)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local function nonempty(s)
  return s ~= nil and s ~= ""
end

if status.verified == true then
  hs.status = "Healthy"
  local name = nil
  if status.taskInfo ~= nil then
    name = status.taskInfo.name or status.taskInfo.id
  end
  if nonempty(name) then
    hs.message = "Verified: " .. name
  else
    hs.message = "Verified"
  end
  return hs
end

local verifying = condition("Verified") or condition("TaskAppVerified")
local failed = condition("Failed") or condition("Degraded")
if failed == nil or failed.status ~= "True" then
  failed = nil
end
if verifying ~= nil and verifying.status == "False" then
  failed = verifying
end
if status.phase == "Failed" or failed ~= nil then
  hs.status = "Degraded"
  if nonempty(status.message) then
    hs.message = status.message
  elseif failed ~= nil and nonempty(failed.message) then
    hs.message = failed.message
  elseif nonempty(status.reason) then
    hs.message = status.reason
  else
    hs.message = "task app verification failed"
  end
  return hs
end

if status.phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = status.message or "Suspended"
  return hs
end

hs.status = "Progressing"
if verifying ~= nil and nonempty(verifying.message) then
  hs.message = verifying.message
elseif nonempty(status.message) then
  hs.message = status.message
elseif nonempty(status.phase) then
  hs.message = status.phase
else
  hs.message = "Waiting for the task app to be verified"
end
return hs
