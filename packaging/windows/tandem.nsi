; Tandem for Windows: installs Tandem as a WSL 2 distribution named "Tandem".
;
; Built on Linux by build_installer.sh, which passes:
;   -DVERSION=<version>      shown in the UI and in Add/Remove Programs
;   -DROOTFS=<path>          tandem-rootfs-<version>.tar.gz (Debian 12 + tandem .deb)
;   -DSTAGE=<dir>            tandem.ico and tandem.cmd made at build time
;   -DOUTFILE=<path>         Tandem-Setup-<version>.exe
;
; Per-user install (HKCU, %LOCALAPPDATA%): `wsl --import` needs no admin rights,
; and WSL distributions are per user anyway, so asking for elevation would only
; make the distribution belong to the wrong account when an admin elevates.

Unicode true
; 64-bit installer: wsl.exe exists only in the 64-bit System32. A 32-bit
; installer is redirected to SysWOW64 there and would need $WINDIR\Sysnative
; paths for every call and shortcut. WSL 2 needs 64-bit Windows anyway.
Target amd64-unicode

!ifndef VERSION | ROOTFS | STAGE | OUTFILE
  !error "use build_installer.sh (needs -DVERSION -DROOTFS -DSTAGE -DOUTFILE)"
!endif

!define DISTRO     "Tandem"
!define UNINST_KEY "Software\Microsoft\Windows\CurrentVersion\Uninstall\Tandem"
!define LXSS_KEY   "Software\Microsoft\Windows\CurrentVersion\Lxss"
!define ENV_KEY    "Environment"
!define WSL        "$SYSDIR\wsl.exe"

Name "Tandem ${VERSION}"
OutFile "${OUTFILE}"
RequestExecutionLevel user
; Fixed location: the distribution's disk goes to $INSTDIR\wsl, and the
; uninstaller finds everything relative to itself.
InstallDir "$LOCALAPPDATA\Tandem"
; Not /SOLID: in a solid archive `SetCompress off` is ignored and the
; already-gzipped rootfs would be pushed through LZMA again (minutes in CI, no gain).
SetCompressor lzma
ManifestDPIAware true
ShowInstDetails show
ShowUninstDetails show

!include "MUI2.nsh"
!include "LogicLib.nsh"
!include "WinMessages.nsh"
!include "FileFunc.nsh"   ; GetParameters, GetOptions
; LinuxUserName, PathWithout: plain functions, in their own file so that
; test/nsis_functions.sh can run them on their own.
!addincludedir "${__FILEDIR__}"
!include "tandem-lib.nsh"

; Declared before the MUI pages: the finish page text uses $UserName.
Var UserName     ; Linux user name derived from the Windows one
Var Existing     ; "1" if a "Tandem" distribution is already registered
Var KeepHome     ; "1" if /home of the existing distribution is carried over
Var PathNew      ; scratch for the PATH functions

!define MUI_ICON   "${STAGE}\tandem.ico"
!define MUI_UNICON "${STAGE}\tandem.ico"
!define MUI_ABORTWARNING

!define MUI_FINISHPAGE_TITLE "Tandem is installed"
; No "Start Tandem Studio" checkbox: with it the text area is so short that
; the GPU note was cut off (seen in a Wine screenshot); the note matters more.
!define MUI_FINISHPAGE_TEXT "Tandem ${VERSION} is the WSL 2 distribution \
  $\"${DISTRO}$\" (user: $UserName).$\r$\n$\r$\n\
  Start menu / desktop: $\"Tandem Studio$\" (opens through WSLg).$\r$\n\
  PowerShell / cmd: $\"tandem$\" (in a newly opened terminal).$\r$\n$\r$\n\
  GPU: CUDA in WSL uses the NVIDIA driver installed on Windows; do not \
  install one inside the distribution. $\"tandem info$\" shows the GPUs it sees."

!define MUI_WELCOMEPAGE_TEXT "This installs Tandem ${VERSION} as a WSL 2 \
  distribution named $\"${DISTRO}$\", for your Windows user only; no \
  administrator rights are needed.$\r$\n$\r$\nWSL 2 must already be enabled \
  (Setup checks and tells you how if not). The distribution is stored in \
  $INSTDIR.$\r$\n$\r$\nClick Install to continue."
!insertmacro MUI_PAGE_WELCOME
!insertmacro MUI_PAGE_INSTFILES
!insertmacro MUI_PAGE_FINISH
!insertmacro MUI_UNPAGE_INSTFILES
!insertmacro MUI_LANGUAGE "English"

; ---------------------------------------------------------------------------
; Shared helpers (macro so the installer and uninstaller each get a copy:
; NSIS requires uninstaller functions to be named un.*)
; ---------------------------------------------------------------------------

; Sets $Existing: WSL keeps one key per distribution under HKCU\...\Lxss with a
; DistributionName value. Reading the registry avoids parsing `wsl --list`,
; whose output is UTF-16 and localized.
!macro DEFINE_FIND_DISTRO prefix
Function ${prefix}FindDistro
  Push $0
  Push $1
  Push $2
  StrCpy $Existing "0"
  StrCpy $0 0
  ${Do}
    EnumRegKey $1 HKCU "${LXSS_KEY}" $0
    ${If} $1 == ""
      ${Break}
    ${EndIf}
    ReadRegStr $2 HKCU "${LXSS_KEY}\$1" "DistributionName"
    ${If} $2 == "${DISTRO}"   ; case-insensitive, as WSL treats names
      StrCpy $Existing "1"
      ${Break}
    ${EndIf}
    IntOp $0 $0 + 1
  ${Loop}
  Pop $2
  Pop $1
  Pop $0
FunctionEnd
!macroend
!insertmacro DEFINE_FIND_DISTRO ""
!insertmacro DEFINE_FIND_DISTRO "un."

; Runs a command, logs its output, returns the exit code in $0.
!macro RUN cmd
  DetailPrint `> ${cmd}`
  nsExec::ExecToLog '${cmd}'
  Pop $0
!macroend

; ---------------------------------------------------------------------------
; Installer
; ---------------------------------------------------------------------------

Function .onInit
  ; wsl.exe prints UTF-16 unless told otherwise; UTF-8 makes the log readable.
  System::Call 'kernel32::SetEnvironmentVariable(t "WSL_UTF8", t "1")'

  ; 1. WSL 2 present and working? `wsl --status` fails when the WSL feature or
  ;    the Virtual Machine Platform is missing; `wsl --version` exists only in
  ;    the Store version of WSL, which is the one with WSLg on Windows 10 too.
  StrCpy $0 "missing"
  ${If} ${FileExists} "${WSL}"
    nsExec::ExecToStack '"${WSL}" --status'
    Pop $0
    Pop $1
    ${If} $0 == 0
      nsExec::ExecToStack '"${WSL}" --version'
      Pop $0
      Pop $1
      ${If} $0 != 0
        StrCpy $0 "old"
      ${EndIf}
    ${EndIf}
  ${EndIf}
  ${If} $0 == "old"
    MessageBox MB_OK|MB_ICONSTOP "This Windows has an old, built-in WSL that \
      cannot run Tandem Studio (no WSLg).$\r$\n$\r$\nUpdate it: open PowerShell \
      as Administrator, run$\r$\n$\r$\n    wsl --update$\r$\n$\r$\nthen run this \
      installer again." /SD IDOK
    Abort
  ${ElseIf} $0 != 0
    MessageBox MB_OK|MB_ICONSTOP "Tandem needs WSL 2, which is not installed or \
      not enabled.$\r$\n$\r$\nTo enable it: open PowerShell as Administrator \
      (right-click Start > Terminal (Admin)), run$\r$\n$\r$\n    \
      wsl --install --no-distribution$\r$\n$\r$\nthen REBOOT and run this \
      installer again. Virtualization must be enabled in the BIOS/UEFI." /SD IDOK
    Abort
  ${EndIf}

  ; 2. Never overwrite an existing "Tandem" distribution without asking.
  StrCpy $KeepHome "0"
  Call FindDistro
  ${If} $Existing == "1"
  ${AndIf} ${Silent}
    ; Silent upgrades only on request: /S /UPGRADE=keep or /S /UPGRADE=discard
    ; (what Yes / No below do). Without it a silent install changes nothing.
    ${GetParameters} $0
    ClearErrors
    ${GetOptions} $0 "/UPGRADE=" $1
    ${If} $1 == "keep"
      StrCpy $KeepHome "1"
    ${ElseIf} $1 != "discard"
      Abort
    ${EndIf}
  ${ElseIf} $Existing == "1"
    MessageBox MB_YESNOCANCEL|MB_ICONEXCLAMATION "A WSL distribution named \
      $\"${DISTRO}$\" is already installed.$\r$\n$\r$\nUpgrading REPLACES \
      every file inside it (programs, settings in /etc, anything installed \
      with apt). Your runs are in your home folder (/home/...) inside it.\
      $\r$\n$\r$\nYes: upgrade and keep /home (copied out to $INSTDIR and \
      back; needs free disk space as large as /home)\
      $\r$\nNo: upgrade and DELETE /home with the old distribution\
      $\r$\nCancel: change nothing" IDYES keep IDNO discard
    Abort
    keep:
      StrCpy $KeepHome "1"
    discard:
  ${EndIf}

  ; 3. Linux user name from the Windows one (tandem-lib.nsh says how).
  ReadEnvStr $R0 USERNAME
  Push $R0
  Call LinuxUserName
  Pop $UserName
FunctionEnd

Section "Tandem" SecMain
  SectionIn RO
  SetOutPath "$INSTDIR"
  SetOverwrite on

  ; Small files: LZMA (the default set above).
  File "${STAGE}\tandem.ico"
  File "${STAGE}\tandem.cmd"
  File "wsl-setup.sh"

  ; The rootfs is already gzip-compressed: store it as is. It goes to the
  ; temporary plugins dir and is deleted after the import.
  InitPluginsDir
  SetOutPath "$PLUGINSDIR"
  SetCompress off
  File "/oname=tandem-rootfs.tar.gz" "${ROOTFS}"
  SetCompress auto
  SetOutPath "$INSTDIR"

  ; Upgrade: optionally copy /home out, then drop the old distribution.
  ${If} $Existing == "1"
    ${If} $KeepHome == "1"
      Delete "$INSTDIR\home-backup.tar"
      !insertmacro RUN '"${WSL}" -d ${DISTRO} -u root --cd "$INSTDIR" -e sh ./wsl-setup.sh backup home-backup.tar'
      ${If} $0 != 0
        MessageBox MB_OK|MB_ICONSTOP "Copying /home out of the existing \
          distribution failed (exit code $0). Nothing was changed." /SD IDOK
        Delete "$INSTDIR\home-backup.tar"
        Abort
      ${EndIf}
    ${EndIf}
    !insertmacro RUN '"${WSL}" --unregister ${DISTRO}'
    ${If} $0 != 0
      MessageBox MB_OK|MB_ICONSTOP "Could not remove the old $\"${DISTRO}$\" \
        distribution (wsl --unregister, exit code $0)." /SD IDOK
      Abort
    ${EndIf}
  ${EndIf}

  ; Import. `--version 2` fails loudly where only WSL 1 works (no Virtual
  ; Machine Platform) instead of silently creating a WSL 1 distribution.
  CreateDirectory "$INSTDIR\wsl"
  DetailPrint "Importing the Tandem distribution (this takes a minute)..."
  !insertmacro RUN '"${WSL}" --import ${DISTRO} "$INSTDIR\wsl" "$PLUGINSDIR\tandem-rootfs.tar.gz" --version 2'
  Delete "$PLUGINSDIR\tandem-rootfs.tar.gz"
  ${If} $0 != 0
    MessageBox MB_OK|MB_ICONSTOP "wsl --import failed (exit code $0); see the \
      details above. Is WSL 2 enabled (wsl --install --no-distribution in an \
      administrator PowerShell, then reboot)?" /SD IDOK
    ; A fresh install leaves nothing behind (no uninstaller is registered yet).
    ${If} $Existing != "1"
      SetOutPath "$TEMP"   ; Windows cannot remove the current directory
      Delete "$INSTDIR\tandem.ico"
      Delete "$INSTDIR\tandem.cmd"
      Delete "$INSTDIR\wsl-setup.sh"
      RMDir "$INSTDIR\wsl"
      RMDir "$INSTDIR"
    ${EndIf}
    Abort
  ${EndIf}

  ; Default user: created now (not in the rootfs) so it matches the Windows user.
  ${If} $KeepHome == "1"
    !insertmacro RUN '"${WSL}" -d ${DISTRO} -u root --cd "$INSTDIR" -e sh ./wsl-setup.sh user $UserName home-backup.tar'
  ${Else}
    !insertmacro RUN '"${WSL}" -d ${DISTRO} -u root --cd "$INSTDIR" -e sh ./wsl-setup.sh user $UserName'
  ${EndIf}
  ${If} $0 != 0
    ; Not fatal: the distribution works, as root. Keep any /home backup.
    MessageBox MB_OK|MB_ICONEXCLAMATION "Setting up the default user failed \
      (exit code $0); Tandem will run as root. If you chose to keep /home, \
      the copy stays in $INSTDIR\home-backup.tar." /SD IDOK
  ${ElseIf} $KeepHome == "1"
    Delete "$INSTDIR\home-backup.tar"
  ${EndIf}
  ; wsl.conf is read when the distribution boots: stop it so the next start
  ; uses the new default user.
  !insertmacro RUN '"${WSL}" --terminate ${DISTRO}'

  ; Shortcuts. WSLg shows the Linux window; the console wsl.exe opens is
  ; started minimized.
  CreateShortcut "$SMPROGRAMS\Tandem Studio.lnk" "${WSL}" "-d ${DISTRO} --cd ~ -- tandem-studio" \
    "$INSTDIR\tandem.ico" 0 SW_SHOWMINIMIZED "" "Tandem Studio (WSL)"
  CreateShortcut "$DESKTOP\Tandem Studio.lnk" "${WSL}" "-d ${DISTRO} --cd ~ -- tandem-studio" \
    "$INSTDIR\tandem.ico" 0 SW_SHOWMINIMIZED "" "Tandem Studio (WSL)"

  ; `tandem` in PowerShell/cmd: tandem.cmd in $INSTDIR, $INSTDIR on the user PATH.
  Call AddToPath

  ; Add/Remove Programs, per user.
  WriteUninstaller "$INSTDIR\uninstall.exe"
  WriteRegStr   HKCU "${UNINST_KEY}" "DisplayName"     "Tandem"
  WriteRegStr   HKCU "${UNINST_KEY}" "DisplayVersion"  "${VERSION}"
  WriteRegStr   HKCU "${UNINST_KEY}" "Publisher"       "Tandem"
  WriteRegStr   HKCU "${UNINST_KEY}" "DisplayIcon"     "$INSTDIR\tandem.ico"
  WriteRegStr   HKCU "${UNINST_KEY}" "InstallLocation" "$INSTDIR"
  WriteRegStr   HKCU "${UNINST_KEY}" "UninstallString" '"$INSTDIR\uninstall.exe"'
  WriteRegStr   HKCU "${UNINST_KEY}" "QuietUninstallString" '"$INSTDIR\uninstall.exe" /S'
  WriteRegDWORD HKCU "${UNINST_KEY}" "NoModify" 1
  WriteRegDWORD HKCU "${UNINST_KEY}" "NoRepair" 1
SectionEnd

; ---------------------------------------------------------------------------
; User PATH (HKCU\Environment). Plain NSIS, no EnVar plugin (Debian's nsis
; does not ship it).
;
; NSIS strings are at most 1024 characters (NSIS_MAX_STRLEN of the stock
; build): a longer PATH would come back truncated and writing it back would
; destroy it. So a PATH that long is left alone and the user is told.
; ---------------------------------------------------------------------------

!define PATH_MAX_SAFE 1000

Function AddToPath
  ReadRegStr $0 HKCU "${ENV_KEY}" "Path"
  StrLen $1 $0
  ${If} $1 > ${PATH_MAX_SAFE}
    MessageBox MB_OK|MB_ICONINFORMATION "Your PATH is too long for the \
      installer to edit safely. To use the tandem command, add$\r$\n    \
      $INSTDIR$\r$\nto your user PATH yourself." /SD IDOK
    Return
  ${EndIf}
  ; Already there (reinstall)? Then leave it.
  Push $0
  Push "$INSTDIR"
  Call PathWithout
  Pop $PathNew
  ${If} $PathNew != $0
    Return
  ${EndIf}
  StrCpy $1 $0 1 -1
  ${If} $0 == ""
  ${OrIf} $1 == ";"
    StrCpy $0 "$0$INSTDIR"
  ${Else}
    StrCpy $0 "$0;$INSTDIR"
  ${EndIf}
  ; REG_EXPAND_SZ like Windows' own PATH editor, so %VARS% in it keep working.
  WriteRegExpandStr HKCU "${ENV_KEY}" "Path" "$0"
  ; Tell Explorer (and so new terminals) that the environment changed.
  SendMessage ${HWND_BROADCAST} ${WM_SETTINGCHANGE} 0 "STR:Environment" /TIMEOUT=5000
FunctionEnd

; PathWithout / un.PathWithout: in tandem-lib.nsh.

Function un.RemoveFromPath
  ReadRegStr $0 HKCU "${ENV_KEY}" "Path"
  StrLen $1 $0
  ${If} $1 > ${PATH_MAX_SAFE}
    DetailPrint "PATH too long to edit safely; remove $INSTDIR from it yourself."
    Return
  ${EndIf}
  Push $0
  Push "$INSTDIR"
  Call un.PathWithout
  Pop $PathNew
  ${If} $PathNew == $0
    Return       ; not in PATH
  ${EndIf}
  ${If} $PathNew == ""
    DeleteRegValue HKCU "${ENV_KEY}" "Path"
  ${Else}
    WriteRegExpandStr HKCU "${ENV_KEY}" "Path" "$PathNew"
  ${EndIf}
  SendMessage ${HWND_BROADCAST} ${WM_SETTINGCHANGE} 0 "STR:Environment" /TIMEOUT=5000
FunctionEnd

; ---------------------------------------------------------------------------
; Uninstaller
; ---------------------------------------------------------------------------

Function un.onInit
  System::Call 'kernel32::SetEnvironmentVariable(t "WSL_UTF8", t "1")'
  MessageBox MB_YESNO|MB_ICONEXCLAMATION|MB_DEFBUTTON2 "Uninstall Tandem?\
    $\r$\n$\r$\nThis unregisters the WSL distribution $\"${DISTRO}$\" and \
    DELETES EVERYTHING INSIDE IT, including your runs in /home.\
    $\r$\n$\r$\nTo keep them, answer No and copy them out first, e.g. \
    from \\wsl$$\${DISTRO}\home in Explorer." /SD IDYES IDYES +2
  Abort
FunctionEnd

Section "Uninstall"
  Call un.FindDistro
  ${If} $Existing == "1"
    !insertmacro RUN '"${WSL}" --unregister ${DISTRO}'
    ${If} $0 != 0
      ; Keep the disk image: it holds the user's data.
      MessageBox MB_OK|MB_ICONEXCLAMATION "wsl --unregister ${DISTRO} failed \
        (exit code $0). Its disk stays in $INSTDIR\wsl; run the command \
        yourself later." /SD IDOK
    ${EndIf}
  ${EndIf}

  Delete "$SMPROGRAMS\Tandem Studio.lnk"
  Delete "$DESKTOP\Tandem Studio.lnk"
  Call un.RemoveFromPath
  DeleteRegKey HKCU "${UNINST_KEY}"

  ; Our files only, no RMDir /r: if unregistering failed, $INSTDIR\wsl still
  ; holds the user's data, and RMDir (without /r) leaves non-empty folders.
  ; A home-backup.tar left by a failed upgrade is user data too: kept.
  Delete "$INSTDIR\tandem.ico"
  Delete "$INSTDIR\tandem.cmd"
  Delete "$INSTDIR\wsl-setup.sh"
  Delete "$INSTDIR\uninstall.exe"
  RMDir "$INSTDIR\wsl"
  RMDir "$INSTDIR"
SectionEnd
